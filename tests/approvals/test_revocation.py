"""Authority ends at revocation (issue 35, SPEC §11): a waiting MCP call — ``approve`` for an
operator's decision, ``delegate`` waiting on its child — ends with −32001 within a second of
its runner's token being rotated or revoked, not with the decision made after it. Real
daphne server, real MCP over HTTP, the real runner SDK."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Approval, ApprovalStatus
from delegation.services import tokens
from tests.support.mcp_tools import LiveRunner, mcp_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


async def _until_pending() -> Approval:
    for _ in range(200):
        found = await sync_to_async(
            lambda: Approval.objects.filter(status=ApprovalStatus.PENDING).first()
        )()
        if found is not None:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError("no pending approval")


def _code(result) -> int | None:
    return (result.structured_content or {}).get("code") if result.is_error else None


@pytest.mark.parametrize("how", ["rotate", "revoke"])
async def test_it_ends_a_waiting_approve_when_its_runners_token_goes(daphne_server, how):
    name = f"approver-{how}"
    token = await sync_to_async(lambda: tokens.create_runner(name)[1])()
    async with LiveRunner(daphne_server, token) as live:
        await live.open("asking-run")
        issued = await live.run_token("asking-run")
        async with mcp_session(issued["url"], issued["token"]) as session:
            call = asyncio.ensure_future(
                session.call_tool("approve", {"tool_name": "Bash", "input": {"command": "rm x"}})
            )
            approval = await _until_pending()
            await asyncio.sleep(0.3)  # waiting on its doorbell now
            if how == "rotate":
                await sync_to_async(tokens.create_runner)(name)  # a new token for the runner
            else:
                await sync_to_async(tokens.revoke_runner)(name)
            gone = time.monotonic()
            result = await asyncio.wait_for(call, 10)
            ended = time.monotonic() - gone
    assert _code(result) == -32001, result
    assert "no longer valid" in result.content[0].text
    assert ended < 1.0, f"the call ended {ended:.2f} s after the token went"
    # Not a decision: the approval is still the operator's to see, undecided.
    await sync_to_async(approval.refresh_from_db)()
    assert approval.decision in ("", None)


async def _delegate_then(daphne_server, name: str, end_authority) -> tuple:
    """A run's ``delegate`` waiting on its child; ``end_authority(live)`` then ends the run
    token's authority. The call's result, and how long after that it came."""
    token = await sync_to_async(lambda: tokens.create_runner(name)[1])()
    async with LiveRunner(daphne_server, token) as live:
        await live.open(f"{name}-run")
        issued = await live.run_token(f"{name}-run")
        async with mcp_session(issued["url"], issued["token"]) as session:
            call = asyncio.ensure_future(
                session.call_tool(
                    "delegate", {"profile": "worker", "message": "work", "waitSeconds": 30}
                )
            )
            for _ in range(100):
                if any(m == "child.execute" for m, _ in live.commands):
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            await end_authority(live)
            gone = time.monotonic()
            result = await asyncio.wait_for(call, 10)
            return result, time.monotonic() - gone


async def test_it_ends_a_delegate_waiting_on_its_child_when_the_token_goes(daphne_server):
    async def revoke(_live):
        await sync_to_async(tokens.revoke_runner)("delegator")

    result, ended = await _delegate_then(daphne_server, "delegator", revoke)
    assert _code(result) == -32001, (result.content[0].text, json.dumps(result.structured_content))
    assert ended < 1.0, f"the call ended {ended:.2f} s after the token went"


async def test_it_ends_a_wait_on_a_child_when_the_callers_own_run_ends(daphne_server):
    """The caller's run token dies with its run: a wait on a child hears it at once."""

    async def finish(live):
        await live.client.finish("finisher-run", output="done early")

    result, ended = await _delegate_then(daphne_server, "finisher", finish)
    assert _code(result) == -32001, result.content[0].text
    assert ended < 1.0, f"the call ended {ended:.2f} s after the run ended"

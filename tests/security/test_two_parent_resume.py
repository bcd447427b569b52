"""Ownership follows the caller's own children only (issue 21): with two running parents on
one conversation, the child parent 2 resumed is parent 2's alone. Parent 1's run token may
read, steer and cancel only the run it started itself, never the resumed one, through MCP and
on the runner socket alike (``childRunId`` is looked up among the caller's own runs)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from delegation.client.errors import NotOwned
from delegation.models import Run
from delegation.services import tokens
from tests.support.mcp_tools import LiveRunner, mcp_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def runner_token(transactional_db):
    return tokens.create_runner("mcp-runner")[1]


def _cancel_requested(run_id: str) -> bool:
    return Run.objects.get(run_id=run_id).cancel_requested_at is not None


async def _two_parents_sharing_a_resumed_child(live: LiveRunner) -> tuple[dict, dict, str, str]:
    """root-1 and root-2 run on one conversation; root-1 starts child C, which finishes;
    root-2 resumes C. Returns both tokens, C's conversation and the resumed run's id."""
    await live.open("root-1")
    await live.client.open_run("conv-root-1", "root-2", extension_id="ext")
    first, second = await live.run_token("root-1"), await live.run_token("root-2")
    async with mcp_session(first["url"], first["token"]) as mcp:
        started = await mcp.call_tool("delegate", {"profile": "worker", "message": "one"})
    child = started.structured_content
    await live.wait_command("child.execute", child["runId"])
    await live.client.finish(child["runId"], output="first answer")
    async with mcp_session(second["url"], second["token"]) as mcp:
        resumed = await mcp.call_tool(
            "delegate",
            {"profile": "worker", "message": "two", "resume": child["conversationId"]},
        )
    assert not resumed.is_error, resumed
    again = resumed.structured_content
    assert again["conversationId"] == child["conversationId"]
    assert again["parentRunId"] == "root-2"
    await live.wait_command("child.execute", again["runId"])
    return first, child, child["conversationId"], again["runId"]


async def test_it_keeps_a_resumed_child_from_the_other_parents_mcp_token(
    daphne_server, runner_token
):
    async with LiveRunner(daphne_server, runner_token) as live:
        first, child, conversation, resumed = await _two_parents_sharing_a_resumed_child(live)
        async with mcp_session(first["url"], first["token"]) as mcp:
            read = await mcp.call_tool("read_child", {"childId": conversation})
            steered = await mcp.call_tool(
                "steer_child", {"childId": conversation, "message": "leak?", "requestId": "s1"}
            )
            cancelled = await mcp.call_tool("cancel_child", {"childId": conversation})
    # Parent 1 sees and acts on its own (finished) run of the child, never parent 2's.
    assert read.structured_content["runId"] == child["runId"], read.structured_content
    assert read.structured_content["output"] == "first answer"
    assert steered.structured_content.get("outcome") == "promptRequired", steered
    assert not cancelled.is_error and cancelled.structured_content["runId"] == child["runId"]
    assert not await sync_to_async(_cancel_requested)(resumed)
    assert [m for m, p in live.commands if m in ("run.steer", "run.cancel")] == []


async def test_it_refuses_the_other_parents_run_by_child_run_id_on_the_runner_socket(
    daphne_server, runner_token
):
    async with LiveRunner(daphne_server, runner_token) as live:
        _first, child, conversation, resumed = await _two_parents_sharing_a_resumed_child(live)
        params = {"runId": "root-1", "extensionId": "ext", "generation": 1}
        mine = await live.client.call(
            "child.read", {**params, "childId": conversation, "childRunId": child["runId"]}
        )
        assert mine["runId"] == child["runId"]
        for method, extra in (
            ("child.read", {}),
            ("child.cancel", {}),
            ("child.steer", {"message": "leak?", "requestId": "s1"}),
        ):
            with pytest.raises(NotOwned):
                await live.client.call(
                    method, {**params, "childId": conversation, "childRunId": resumed, **extra}
                )
    assert not await sync_to_async(_cancel_requested)(resumed)

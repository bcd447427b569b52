"""Waiting for a decision, against a live server (SPEC §11): fifty agents waiting on
approvals hold neither a thread nor a database connection each (the ``approve`` calls wait on
their run's doorbell; counted from outside the server process), and a decision made while
the runner is away reaches it after it reconnects (``approval.decided`` is stored and resent
like every command)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from delegation.models import Approval, ApprovalStatus, Run
from delegation.selectors.approvals import get_approval
from delegation.services import approvals, tokens
from delegation.services.identity import Actor
from tests.support.mcp_tools import LiveRunner, mcp_session
from tests.support.personas import make_person

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
WAITERS = 50


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _server_connections() -> int:
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def _pending() -> list[str]:
    rows = Approval.objects.filter(status=ApprovalStatus.PENDING)
    return list(rows.values_list("approval_id", flat=True))


async def test_it_holds_no_thread_or_connection_per_waiting_approval(daphne_server):
    token = await sync_to_async(lambda: tokens.create_runner("waiters")[1])()
    operator = await sync_to_async(make_person)("operator")
    pid = daphne_server.process.pid
    async with LiveRunner(daphne_server, token) as live, contextlib.AsyncExitStack() as stack:
        await live.open("waiting-run")
        issued = await live.run_token("waiting-run")
        sessions = [
            await stack.enter_async_context(mcp_session(issued["url"], issued["token"]))
            for _ in range(2)
        ]
        # One answered call first, so the server's pools are as warm as they will get.
        policy = {"rules": [{"match": {"tool": "Read"}, "decision": "allow"}], "default": "ask"}
        run = await sync_to_async(Run.objects.get)(run_id="waiting-run")
        await sync_to_async(approvals.store_policy)(run, policy, source="operator")
        warm = await sessions[0].call_tool("approve", {"tool_name": "Read", "input": {"p": "x"}})
        assert json.loads(warm.content[0].text)["behavior"] == "allow"
        threads, conns = _threads(pid), await sync_to_async(_server_connections)()
        calls = [
            asyncio.ensure_future(
                sessions[i % 2].call_tool("approve", {"tool_name": "Bash", "input": {"n": i}})
            )
            for i in range(WAITERS)
        ]
        for _ in range(400):
            waiting = await sync_to_async(_pending)()
            if len(waiting) == WAITERS:
                break
            await asyncio.sleep(0.05)
        assert len(waiting) == WAITERS
        await asyncio.sleep(0.5)
        assert _threads(pid) < threads + 5
        assert await sync_to_async(_server_connections)() < conns + 5
        actor = Actor.for_user(operator, via="api")
        for approval_id in waiting:
            approval = await sync_to_async(get_approval)(approval_id)
            await sync_to_async(approvals.do_decide_approval)(
                actor=actor, approval=approval, decision="deny", message=f"no {approval_id}"
            )
        answers = await asyncio.gather(*calls)
    denied = [json.loads(a.content[0].text) for a in answers]
    assert all(d["behavior"] == "deny" and d["message"].startswith("no ap-") for d in denied)


async def test_it_delivers_a_decision_made_while_the_runner_was_away(daphne_server):
    token = await sync_to_async(lambda: tokens.create_runner("away")[1])()
    async with LiveRunner(daphne_server, token) as live:
        await live.open("away-run")
        asked = await live.client.call(
            "approval.request",
            {"runId": "away-run", "toolCallId": "t1", "toolName": "Bash", "input": {"c": 1}},
        )
    assert asked["status"] == "pending"
    operator = await sync_to_async(make_person)("operator")
    await sync_to_async(approvals.do_decide_approval)(
        actor=Actor.for_user(operator, via="api"),
        approval=await sync_to_async(get_approval)(asked["approvalId"]),
        decision="deny",
        message="not now",
    )
    back = LiveRunner(daphne_server, token)
    back.client.on("approval.decided", back._recorder("approval.decided"))
    async with back:
        for _ in range(200):
            if any(m == "approval.decided" for m, _ in back.commands):
                break
            await asyncio.sleep(0.05)
    (params,) = [p for m, p in back.commands if m == "approval.decided"]
    assert params == {
        "approvalId": asked["approvalId"],
        "runId": "away-run",
        "decision": "deny",
        "message": "not now",
    }

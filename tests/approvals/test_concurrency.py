"""Approvals under concurrency and faults (SPEC §11): two operators deciding at once get one
decision and one 409; a decision made while the runner is away reaches it after it
reconnects (``approval.decided`` is stored and resent like every command)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from delegation import rpc
from delegation.models import Approval, AuditEntry
from delegation.selectors.approvals import get_approval
from delegation.services import approvals, tokens
from delegation.services.identity import Actor
from tests.support.concurrency import parallel_writers, service_connection
from tests.support.mcp_tools import LiveRunner
from tests.support.personas import make_person

pytestmark = pytest.mark.django_db(transaction=True)


@parallel_writers
def test_it_gives_two_operators_deciding_at_once_one_decision_and_one_conflict():
    conn = service_connection()
    rpc.open_run(conn, {"conversationId": "c-root", "runId": "root", "extensionId": "ext"})
    asked = rpc.approval_request(
        conn, {"runId": "root", "toolCallId": "t", "toolName": "Bash", "input": {"command": "x"}}
    )
    people = [make_person("operator"), make_person("admin")]
    barrier = threading.Barrier(2)
    outcomes = [None, None]

    def decide(i):
        try:
            barrier.wait(timeout=30)
            approvals.do_decide_approval(
                actor=Actor.for_user(people[i], via="api"),
                approval=get_approval(asked["approvalId"]),
                decision=("allow", "deny")[i],
            )
            outcomes[i] = "decided"
        except approvals.AlreadyDecided as exc:
            outcomes[i] = str(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(o == "decided" for o in outcomes) == [False, True], outcomes
    approval = Approval.objects.get(approval_id=asked["approvalId"])
    loser = next(o for o in outcomes if o != "decided")
    assert f"already decided: {approval.decision} by {approval.decided_by}" in loser
    assert AuditEntry.objects.filter(action="approve").count() == 2


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

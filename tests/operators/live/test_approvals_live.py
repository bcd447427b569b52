"""The inbox's doorbell on /ws/live/ (SPEC §11, "live"): ``{"type": "subscribe", "approvals":
true}`` over real WebSocket frames into the ASGI app, real DB. A request and a decision ring
the subscribed socket once their transaction commits; a viewer may subscribe; the frame only
counts (the list is read by REST)."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.db import connection, transaction

from delegation import models
from delegation.services.approvals import VIA_MCP, ToolUse, do_decide_approval, do_request_approval
from delegation.services.run_actions import Actor
from tests.support.live import ORIGIN, check_frames, frame, live_socket, until
from tests.support.personas import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

# Far beyond the test: every frame below comes by doorbell, not by a heartbeat's catch-up.
HEARTBEAT = 60.0


async def viewer_socket(viewer):
    cookie = await database_sync_to_async(session_cookie)(viewer)
    ws = live_socket([ORIGIN, (b"cookie", cookie)])
    assert (await ws.connect(timeout=10))[0]
    hello = await frame(ws)
    assert hello["type"] == "hello" and hello["role"] == "viewer"
    return ws


async def subscribed(ws) -> list[dict]:
    await ws.send_json_to({"type": "subscribe", "approvals": True})
    frames = await until(ws, lambda f: f["type"] == "approvals")
    assert {"type": "subscribed", "approvals": True} in frames
    return frames


def _request_and_hold(run_pk: int, call: str, hold: float) -> str:
    """Request an approval in a transaction that stays open ``hold`` seconds after it.

    Run on a thread of its own (not the sockets' database thread, which it would block), so
    a ring sent before the commit would reach the socket while the transaction is open.
    """
    try:
        with transaction.atomic():
            run = models.Run.objects.get(pk=run_pk)
            use = ToolUse(tool_name="Bash", input={"command": "touch b"}, tool_call_id=call)
            approval = do_request_approval(run=run, use=use, via=VIA_MCP, actor_label="agent")
            time.sleep(hold)
        return approval.approval_id
    finally:
        connection.close()


async def test_it_rings_a_viewers_socket_after_a_request_and_a_decision_commit(
    runner, operator, viewer, settings
):
    settings.LIVE_HEARTBEAT_SECONDS = HEARTBEAT
    await runner.open("root-1")
    ws = await viewer_socket(viewer)
    frames = await subscribed(ws)
    assert frames[-1] == {"type": "approvals", "pending": 0}

    asked = await runner.ok(
        "approval.request",
        {"runId": "root-1", "toolCallId": "t-1", "toolName": "Bash", "input": {"command": "ls"}},
    )
    assert asked["status"] == "pending"
    frames += await until(ws, lambda f: f["type"] == "approvals", timeout=5)
    assert frames[-1] == {"type": "approvals", "pending": 1}

    # Nothing rings while the requesting transaction is open; its commit rings.
    run = await database_sync_to_async(models.Run.objects.get)(run_id="root-1")
    held = asyncio.ensure_future(
        sync_to_async(_request_and_hold, thread_sensitive=False)(run.pk, "t-2", 1.5)
    )
    assert await ws.receive_nothing(timeout=1.0)
    second = await held
    frames += await until(ws, lambda f: f["type"] == "approvals", timeout=5)
    assert frames[-1] == {"type": "approvals", "pending": 2}

    approval = await database_sync_to_async(models.Approval.objects.get)(approval_id=second)
    await database_sync_to_async(do_decide_approval)(
        actor=Actor.for_user(operator, via="api"), approval=approval, decision="deny"
    )
    frames += await until(ws, lambda f: f["type"] == "approvals", timeout=5)
    assert frames[-1] == {"type": "approvals", "pending": 1}
    assert not [f for f in frames if f["type"] == "heartbeat"]
    # The frame carries a count and nothing of the approval.
    assert all(set(f) == {"type", "pending"} for f in frames if f["type"] == "approvals")
    check_frames(frames)

    # Unsubscribed: a further decision rings nothing on this socket.
    await ws.send_json_to({"type": "unsubscribe", "approvals": True})
    first = await database_sync_to_async(models.Approval.objects.get)(
        approval_id=asked["approvalId"]
    )
    await asyncio.sleep(0.3)
    await database_sync_to_async(do_decide_approval)(
        actor=Actor.for_user(operator, via="api"), approval=first, decision="allow"
    )
    assert await ws.receive_nothing(timeout=1.0)
    await ws.disconnect()


async def test_it_refuses_a_subscribe_frame_that_mixes_approvals_with_another_kind(viewer):
    ws = await viewer_socket(viewer)
    await ws.send_json_to({"type": "subscribe", "approvals": True, "runners": True})
    error = await frame(ws)
    assert error["type"] == "error" and "approvals" in error["message"]
    await ws.send_json_to({"type": "subscribe", "approvals": False})
    error = await frame(ws)
    assert error["type"] == "error" and error["field"] == "approvals"
    await ws.disconnect()

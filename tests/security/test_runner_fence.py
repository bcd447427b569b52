"""Issue 15 findings 3 and 14 on the runner socket, over real WebSocket frames.

3: rotating or revoking a runner's token ends its open sockets' authority at once: they are
closed with 4401, get no more commands, and their answers and frames change nothing.
14: an unexpected error inside a frame is answered -32603 and kills nothing; once the socket
is gone its tasks are gone too, so the runner is marked lost on time.
"""

from __future__ import annotations

import asyncio
import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from delegation import models
from delegation.runner_socket import consumer
from delegation.services import answers, sweep, tokens
from delegation.services.run_actions import Actor, do_steer_run
from tests.support.rpc import adb, communicator

pytestmark = pytest.mark.django_db(transaction=True)


def _steer(operator, run_id: str, request_id: str):
    run = models.Run.objects.get(run_id=run_id)
    return do_steer_run(
        Actor.for_user(operator, via="api"), run, request_id=request_id, message="stop that"
    )


def _rotate(name: str) -> str:
    out = io.StringIO()
    call_command("runner_token", "rotate", name, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


@pytest.mark.parametrize("how", ["revoke", "rotate"])
async def test_it_fences_an_open_runner_socket_at_once_when_its_token_goes(
    how, runner, operator, make_client
):
    await runner.open("root-1")
    runner.answer_commands = False
    await adb(_steer)(operator, "root-1", "s-1")
    steer = await runner.wait_command("run.steer")

    if how == "revoke":
        await adb(tokens.revoke_runner)("runner-a")
    else:
        await adb(_rotate)("runner-a")
    assert await runner.closed_with() == 4401

    # Even a frame that raced the close changes nothing: the answer and the events are refused.
    answer = {"jsonrpc": "2.0", "id": steer["id"], "result": {"outcome": "injected"}}
    await runner.send_raw(json.dumps(answer))
    command = await adb(models.Command.objects.get)(pk=int(steer["id"].removeprefix("srv-")))
    assert command.answered_at is None
    await adb(_steer)(operator, "root-1", "s-2")
    await asyncio.sleep(0.3)
    later = await adb(models.Command.objects.get)(steer__request_id="s-2")
    assert later.sent_at is None  # kept for the runner's next valid connection
    run = await adb(models.Run.objects.get)(run_id="root-1")
    assert run.emitted == 0
    stored = await adb(models.Runner.objects.get)(name="runner-a")
    assert not stored.connected and stored.disconnected_at is not None


async def test_it_refuses_the_old_token_on_a_socket_opened_before_the_rotation(
    runner_token, make_client
):
    early = await make_client(runner_token, register=False)
    await adb(_rotate)("runner-a")
    assert await early.closed_with() == 4401
    # A fresh socket with the old token is refused at the handshake.
    late = communicator(runner_token)
    connected, _ = await late.connect(timeout=10)
    assert not connected or (await late.receive_output(timeout=5))["code"] == 4401


async def test_it_answers_a_rotated_socket_that_missed_the_close_with_stale_connection(
    runner_token, make_client
):
    early = await make_client(runner_token, register=False)
    runner = await adb(models.Runner.objects.get)(name="runner-a")
    new = tokens.new_runner_token()
    # The close message is lost (the socket's process missed it): the credential check
    # at register still refuses the old token.
    await adb(_rotate_quietly)(runner, new)
    error = await early.error("runner.register", {"hostInstanceId": "h", "extensions": []})
    assert error["code"] == -32002 and "rotated" in error["message"]


def _rotate_quietly(runner, token):
    from delegation import notify

    original = notify.runner_fenced
    notify.runner_fenced = lambda *a, **k: None
    try:
        tokens.rotate_runner(runner, token)
    finally:
        notify.runner_fenced = original


async def test_it_answers_an_unexpected_error_in_a_frame_and_leaves_no_task_behind(
    runner, settings, monkeypatch
):
    settings.OUTBOX_RESEND_SECONDS = 0.1
    settings.RUNNER_GRACE_SECONDS = 0.5
    await runner.open("root-1")

    def explode(*args, **kwargs):
        raise RuntimeError("a bug in an answer handler")

    monkeypatch.setattr(answers, "command_answered", explode)
    # An answer to a server request goes through the (now broken) answer handler.
    await runner.send_raw('{"jsonrpc": "2.0", "id": "srv-1", "result": {}}')
    crash = await runner.next_response()
    assert crash["error"]["code"] == -32603 and crash["id"] is None
    assert (
        await runner.ok(
            "run.event",
            {"runId": "root-1", "from": 1, "events": [{"kind": "text", "text": "still here"}]},
        )
    )["emitted"] == 1

    await runner.close()
    closed = await adb(models.Runner.objects.get)(name="runner-a")
    assert not closed.connected
    await asyncio.sleep(0.5)  # five resend periods: a leftover poll would touch the row
    later = await adb(models.Runner.objects.get)(name="runner-a")
    assert later.last_seen_at == closed.last_seen_at
    report = await adb(sweep.sweep)(timezone.now() + timedelta(seconds=0.6))
    assert report.lost_runners == ["runner-a"]
    run = await adb(models.Run.objects.get)(run_id="root-1")
    assert run.status == "lost"


async def test_it_cancels_the_consumers_tasks_when_a_frame_crashes_it(
    runner, settings, monkeypatch
):
    settings.OUTBOX_RESEND_SECONDS = 0.1
    await runner.open("root-1")

    async def crash(self, *args, **kwargs):
        raise consumer.StopConsumer  # ends the consumer without disconnect()

    monkeypatch.setattr(consumer.RunnerSocketConsumer, "receive", crash)
    await runner.send_raw("{}")
    await asyncio.sleep(0.3)
    stopped = await adb(models.Runner.objects.get)(name="runner-a")
    await asyncio.sleep(0.5)
    later = await adb(models.Runner.objects.get)(name="runner-a")
    assert not stopped.connected
    assert later.last_seen_at == stopped.last_seen_at

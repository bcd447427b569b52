"""SPEC §5 server-to-runner commands (stored before sent, resent after a re-register until
answered) and runner loss after the grace period."""

import json
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from delegation.models import Command, Lease, Run, Runner
from delegation.services import sweep
from tests.support.rpc import adb
from tests.support.state import state

pytestmark = pytest.mark.django_db(transaction=True)


async def _answer(client, command, result=None):
    frame = {"jsonrpc": "2.0", "id": command["id"], "result": {} if result is None else result}
    await client.send_raw(json.dumps(frame))
    await client.quiet(0.1)


async def _command(method) -> Command:
    return await adb(Command.objects.select_related("steer").get)(method=method)


async def _silent(client):
    client.answer_commands = False
    return client


# --- each command, resent after a re-register until answered --------------------------------


async def _child_execute(client):
    await client.open("root-1")
    await client.start()
    return "child.execute", {}


async def _run_cancel(client):
    await client.open("root-1")
    client.answer_commands = True
    child = await client.start()
    await client.wait_command("child.execute")
    client.answer_commands = False
    await client.ok("child.cancel", client.on_child(child))
    return "run.cancel", {"runId": child["runId"]}


async def _run_steer(client):
    await client.open("root-1")
    client.answer_commands = True
    child = await client.start()
    await client.wait_command("child.execute")
    client.answer_commands = False
    await client.ok("child.steer", client.on_child(child, message="m", requestId="s"))
    return "run.steer", {"runId": child["runId"], "requestId": "s", "message": "m"}


async def _lease_revoked(client):
    await client.open("root-1")
    client.answer_commands = True
    child = await client.start(lease="L1")
    await client.wait_command("child.execute")
    await client.finish(child["runId"])
    client.answer_commands = False
    await adb(sweep.sweep)(timezone.now() + timedelta(seconds=3601))
    return "lease.revoked", {"leaseId": "L1"}


SETUPS = {
    "child.execute": _child_execute,
    "run.cancel": _run_cancel,
    "run.steer": _run_steer,
    "lease.revoked": _lease_revoked,
}


@pytest.mark.parametrize("method", list(SETUPS))
async def test_it_resends_a_command_after_a_reconnect_until_it_is_answered(
    runner_token, make_client, method
):
    first = await make_client(runner_token)
    first.answer_commands = False
    _method, match = await SETUPS[method](first)
    sent = await first.wait_command(method, **match)
    stored = await _command(method)
    assert stored.answered_at is None and stored.wire_params() == sent["params"]
    await first.close()

    # A new connection gets it again, with the same id and params.
    second = await make_client(runner_token, register=False)
    second.answer_commands = False
    await second.register()
    again = await second.wait_command(method, **match)
    assert again["id"] == sent["id"] and again["params"] == sent["params"]
    await _answer(second, again, {"outcome": "injected"} if method == "run.steer" else {})
    assert (await _command(method)).answered_at is not None
    await second.close()

    # Once answered it is never sent again.
    third = await make_client(runner_token, register=False)
    third.answer_commands = False
    await third.register()
    await third.quiet(0.4)
    assert third.commands_of(method) == []


async def test_it_resends_unanswered_commands_on_a_second_register_of_the_same_socket(runner):
    runner.answer_commands = False
    await runner.open("root-1")
    await runner.start()
    first = await runner.wait_command("child.execute")
    await runner.register()
    await runner.quiet(0.3)
    copies = [f for f in runner.commands if f["id"] == first["id"]]
    assert len(copies) == 2


async def test_it_stores_a_command_before_sending_it(runner):
    runner.answer_commands = False
    await runner.open("root-1")
    child = await runner.start()
    command = await _command("child.execute")
    assert command.params["identity"]["runId"] == child["runId"]
    sent = await runner.wait_command("child.execute")
    assert sent["id"] == command.rpc_id


async def test_it_sends_commands_as_json_rpc_requests(runner):
    runner.answer_commands = False
    await runner.open("root-1")
    await runner.start()
    sent = await runner.wait_command("child.execute")
    assert set(sent) == {"jsonrpc", "id", "method", "params"}
    assert sent["jsonrpc"] == "2.0"


async def test_it_does_not_resend_a_command_answered_with_an_error(runner_token, make_client):
    first = await make_client(runner_token)
    first.answer_commands = False
    await first.open("root-1")
    await first.start()
    sent = await first.wait_command("child.execute")
    await first.send_raw(
        json.dumps({"jsonrpc": "2.0", "id": sent["id"], "error": {"code": -1, "message": "no"}})
    )
    # Frames are handled in order: once the sentinel is answered, the answer was handled
    # (a fixed pause was not always long enough on a loaded machine).
    sentinel = await first.error("run.event", {})
    assert sentinel["code"] == -32602
    assert (await _command("child.execute")).answered_at is not None
    await first.close()
    second = await make_client(runner_token)
    await second.quiet(0.3)
    assert second.commands_of("child.execute") == []


async def test_it_ignores_an_answer_from_a_fenced_connection(runner_token, make_client):
    first = await make_client(runner_token)
    first.answer_commands = False
    await first.open("root-1")
    await first.start()
    sent = await first.wait_command("child.execute")
    second = await make_client(runner_token)
    second.answer_commands = False
    again = await second.wait_command("child.execute")
    assert again["id"] == sent["id"]
    assert await first.closed_with() == 4409
    # The fenced socket's late answer (sent before the client saw the close) does not count.
    await first.send_raw(json.dumps({"jsonrpc": "2.0", "id": sent["id"], "result": {}}))
    # Frames are handled in order: once the sentinel is answered, the answer was handled.
    sentinel = await first.error("run.open", {"conversationId": "c-late", "runId": "late"})
    assert sentinel["code"] == -32002
    command = await _command("child.execute")
    assert command.answered_at is None


async def test_it_ignores_an_answer_from_a_connection_fenced_only_in_the_database(
    runner_token, make_client
):
    """A newer connection registered, but its fencing message has not reached this socket
    yet: the socket is still open and its answer reaches the server, which must refuse it."""
    first = await make_client(runner_token)
    first.answer_commands = False
    await first.open("root-1")
    await first.start()
    sent = await first.wait_command("child.execute")
    await adb(Runner.objects.update)(connection_generation=F("connection_generation") + 1)
    await first.send_raw(json.dumps({"jsonrpc": "2.0", "id": sent["id"], "result": {}}))
    sentinel = await first.error("run.open", {"conversationId": "c-late", "runId": "late"})
    assert sentinel["code"] == -32002, sentinel
    command = await _command("child.execute")
    assert command.answered_at is None


# --- runner loss --------------------------------------------------------------------------------


async def _disconnected_runner_with_work(runner_token, make_client):
    client = await make_client(runner_token)
    await client.open("root-1")
    fg = await client.start(request_id="fg")
    bg = await client.start(request_id="bg", lease="L1")
    await client.open("root-2")
    await client.finish("root-2", output="done before")
    await client.wait_command("child.execute")
    await client.close()
    return fg, bg


async def test_it_keeps_runs_as_they_are_during_the_grace_period(runner_token, make_client):
    await _disconnected_runner_with_work(runner_token, make_client)
    before = await state()
    report = await adb(sweep.sweep)(timezone.now() + timedelta(seconds=20))
    assert report.lost_runners == []
    assert await state() == before


async def test_it_marks_runs_lost_after_the_grace_period(runner_token, make_client):
    fg, bg = await _disconnected_runner_with_work(runner_token, make_client)
    report = await adb(sweep.sweep)(timezone.now() + timedelta(seconds=31))
    assert report.lost_runners == ["runner-a"]
    runs = await adb(
        lambda: {r.run_id: (r.status, r.done, r.error, r.output) for r in Run.objects.all()}
    )()
    for run_id in ("root-1", fg["runId"], bg["runId"]):
        status, done, error, _ = runs[run_id]
        assert done is True and error == "runner lost", runs[run_id]
    # A run that had already finished keeps its outcome.
    assert runs["root-2"] == ("succeeded", True, "", "done before")
    lease = await adb(Lease.objects.get)(lease_id="L1")
    assert lease.state not in ("active",)
    runner = await adb(Runner.objects.get)(name="runner-a")
    assert runner.lost_at is not None


async def test_it_uses_the_runner_grace_seconds_setting(runner_token, make_client, settings):
    settings.RUNNER_GRACE_SECONDS = 0.2
    await _disconnected_runner_with_work(runner_token, make_client)
    # A sweep a second later, rather than sleeping past the grace period.
    report = await adb(sweep.sweep)(timezone.now() + timedelta(seconds=1))
    assert report.lost_runners == ["runner-a"]
    assert await adb(Run.objects.filter(error="runner lost").count)() == 3


async def test_it_keeps_runs_of_a_runner_that_re_registers_in_time(
    runner_token, make_client, settings
):
    settings.RUNNER_GRACE_SECONDS = 0.2
    fg, _bg = await _disconnected_runner_with_work(runner_token, make_client)
    back = await make_client(runner_token)  # registered once this returns
    report = await adb(sweep.sweep)(timezone.now() + timedelta(seconds=60))
    assert report.lost_runners == []
    read = await back.read(fg)
    assert (read["done"], read["status"]) == (False, "running")


async def test_it_resends_pending_commands_to_a_runner_that_comes_back_in_time(
    runner_token, make_client
):
    first = await make_client(runner_token)
    first.answer_commands = False
    await first.open("root-1")
    child = await first.start()
    await first.wait_command("child.execute")
    await first.close()
    back = await make_client(runner_token)
    execute = await back.wait_command("child.execute")
    assert execute["params"]["identity"]["runId"] == child["runId"]


async def test_it_shows_a_lost_child_to_a_runner_that_comes_back_late(runner_token, make_client):
    await _disconnected_runner_with_work(runner_token, make_client)
    await adb(sweep.sweep)(timezone.now() + timedelta(seconds=31))
    back = await make_client(runner_token)
    # The parent is done, so the foreground child is only reachable through the DB now; the
    # lease was revoked.
    error = await back.error("child.read", back.on_child("x", "root-1"))
    assert error["code"] == -32014
    lease = await back.error("child.read", back.on_child("x", None, leaseId="L1"))
    assert lease["code"] == -32015

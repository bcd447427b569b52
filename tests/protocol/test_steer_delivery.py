"""A runner's answer to run.steer: a refused steer is marked undelivered everywhere an operator
looks (receipt, stream, REST, audit); an injected one changes nothing."""

import json

import pytest
from django.contrib.auth.models import User

from delegation.models import AuditEntry, Command, Event, SteerReceipt
from tests.support.api import Api
from tests.support.personas import USERNAMES, make_person
from tests.support.rpc import adb
from tests.support.state import state

pytestmark = pytest.mark.django_db(transaction=True)


async def _steered_child(runner, request_id="s-1", message="focus on tests"):
    """A running child steered once, its run.steer command received but not yet answered."""
    await runner.open("root-1")
    child = await runner.start()
    runner.answer_commands = False
    answer = await runner.ok(
        "child.steer", runner.on_child(child, message=message, requestId=request_id)
    )
    assert answer == {"outcome": "injected"}
    command = await runner.wait_command("run.steer", runId=child["runId"])
    return child, command


async def _answer(runner, command, result):
    await runner.send_raw(json.dumps({"jsonrpc": "2.0", "id": command["id"], "result": result}))


async def _rest(path):
    def get():
        user = User.objects.filter(username=USERNAMES["operator"]).first() or make_person(
            "operator"
        )
        api = Api(user, "token")
        response = api.get(path)
        assert response.status_code == 200, response.content
        return response.json()

    return await adb(get)()


async def test_it_marks_a_steer_the_runner_refuses_as_undelivered(runner):
    child, command = await _steered_child(runner)
    assert command["params"] == {
        "runId": child["runId"],
        "requestId": "s-1",
        "message": "focus on tests",
    }
    await _answer(runner, command, {"outcome": "promptRequired", "reason": "turnEnded"})

    # Frames are handled in order, so this read sees the answer's effects.
    read = await runner.read(child)
    undelivered = [e for e in read["events"] if e["kind"] == "steer-undelivered"]
    assert [e["kind"] for e in read["events"]] == ["steer", "steer-undelivered"]
    stored = await adb(Event.objects.get)(kind="steer-undelivered")
    assert stored.actor == "runner:runner-a"
    assert undelivered[0]["text"] == "steer s-1 was not delivered: promptRequired (turnEnded)"
    assert undelivered[0]["error"] == "promptRequired (turnEnded)"
    assert stored.data == {
        "requestId": "s-1",
        "outcome": "promptRequired",
        "reason": "turnEnded",
    }

    receipt = await adb(SteerReceipt.objects.get)(request_id="s-1")
    assert receipt.undelivered_at is not None
    assert (receipt.outcome, receipt.runner_outcome, receipt.runner_reason) == (
        "injected",
        "promptRequired",
        "turnEnded",
    )
    assert receipt.delivery == "undelivered"
    entry = await adb(AuditEntry.objects.get)(action="steer")
    assert entry.outcome == "undelivered: promptRequired"
    assert entry.pk == receipt.audit_entry_id

    steers = await _rest(f"/api/runs/{child['runId']}/steers")
    assert [
        (s["requestId"], s["outcome"], s["delivery"], s["runnerOutcome"], s["runnerReason"])
        for s in steers["items"]
    ] == [("s-1", "injected", "undelivered", "promptRequired", "turnEnded")]
    assert steers["items"][0]["undeliveredAt"] is not None
    events = await _rest(f"/api/runs/{child['runId']}/events")
    assert [e["kind"] for e in events["items"]] == ["steer", "steer-undelivered"]
    assert events["items"][1]["error"] == "promptRequired (turnEnded)"
    audit = await _rest("/api/audit?action=steer")
    assert [a["outcome"] for a in audit["items"]] == ["undelivered: promptRequired"]

    # A repeated requestId still answers what it answered first (the idempotent answer).
    again = runner.on_child(child, message="focus on tests", requestId="s-1")
    assert await runner.ok("child.steer", again) == {"outcome": "injected"}


async def test_it_marks_the_steer_delivered_when_the_runner_injects_it(runner):
    child, command = await _steered_child(runner)
    steers = await _rest(f"/api/runs/{child['runId']}/steers")
    assert [s["delivery"] for s in steers["items"]] == ["queued"]  # not answered yet
    before = await state()
    await _answer(runner, command, {"outcome": "injected"})
    read = await runner.read(child)
    assert [e["kind"] for e in read["events"]] == ["steer"]
    after = await state()
    assert after["counts"] == before["counts"]
    receipt = await adb(SteerReceipt.objects.get)(request_id="s-1")
    delivery = await adb(lambda: receipt.delivery)()
    assert (receipt.undelivered_at, receipt.runner_outcome, delivery) == (None, "", "delivered")
    assert (await adb(AuditEntry.objects.get)(action="steer")).outcome == "injected"
    steers = await _rest(f"/api/runs/{child['runId']}/steers")
    assert [s["delivery"] for s in steers["items"]] == ["delivered"]


async def test_it_keeps_one_record_of_a_steer_and_links_command_and_audit_to_it(runner):
    child, _command = await _steered_child(runner, request_id="only-here")
    receipt = await adb(SteerReceipt.objects.get)(request_id="only-here")
    stored = await adb(Command.objects.get)(method="run.steer")
    assert stored.steer_id == receipt.pk and stored.params == {"runId": child["runId"]}
    entry = await adb(AuditEntry.objects.get)(action="steer")
    assert entry.pk == receipt.audit_entry_id and "requestId" not in entry.detail


async def test_it_refuses_steer_undelivered_from_a_runner(runner):
    await runner.open("root-1")
    error = await runner.error(
        "run.event",
        {"runId": "root-1", "from": 1, "events": [{"kind": "steer-undelivered", "text": "x"}]},
    )
    assert error["code"] == -32602 and "reserved for the server" in error["message"]

"""SPEC §6 child.cancel and child.steer: outcomes, idempotency, receipts, commands, audit."""

import json

import pytest

from delegation.models import AuditEntry, Command, SteerReceipt
from tests.support.rpc import DEFAULT_EXTENSION, adb, create_runner_async
from tests.support.state import assert_all_refused, event_kinds, state

pytestmark = pytest.mark.django_db(transaction=True)


async def _child(runner, **kw):
    await runner.open("root-1")
    return await runner.start(**kw)


async def _audit(action):
    return await adb(
        lambda: list(AuditEntry.objects.filter(action=action).values("target_id", "outcome"))
    )()


# --- child.cancel ------------------------------------------------------------------------------


async def test_it_cancels_a_child_and_answers_a_snapshot_at_once(runner):
    child = await _child(runner)
    snapshot = await runner.ok("child.cancel", runner.on_child(child))
    assert snapshot["runId"] == child["runId"]
    # Not done until the runner confirms.
    assert (snapshot["done"], snapshot["cancelled"], snapshot["status"]) == (
        False,
        False,
        "running",
    )
    command = await runner.wait_command("run.cancel", runId=child["runId"])
    assert set(command["params"]) == {"runId", "reason"}
    assert isinstance(command["params"]["reason"], str)
    assert await event_kinds(child["runId"]) == ["cancel-requested"]
    await runner.finish(child["runId"], cancelled=True)
    read = await runner.read(child)
    assert (read["done"], read["cancelled"], read["status"]) == (True, True, "cancelled")
    assert await _audit("cancel") == [{"target_id": child["runId"], "outcome": "requested"}]


async def test_it_treats_a_repeated_cancel_as_idempotent(runner):
    child = await _child(runner)
    await runner.ok("child.cancel", runner.on_child(child))
    await runner.wait_command("run.cancel", runId=child["runId"])
    again = await runner.ok("child.cancel", runner.on_child(child))
    assert again["runId"] == child["runId"] and again["done"] is False
    await runner.quiet(0.2)
    assert len(runner.commands_of("run.cancel", runId=child["runId"])) == 1
    assert await event_kinds(child["runId"]) == ["cancel-requested"]
    await runner.finish(child["runId"], cancelled=True)
    third = await runner.ok("child.cancel", runner.on_child(child))
    assert (third["done"], third["cancelled"]) == (True, True)
    assert await event_kinds(child["runId"]) == ["cancel-requested"]
    assert await adb(Command.objects.filter(method="run.cancel").count)() == 1


async def test_it_answers_a_cancel_of_a_finished_child_without_a_command(runner):
    child = await _child(runner)
    await runner.finish(child["runId"], output="done")
    snapshot = await runner.ok("child.cancel", runner.on_child(child))
    assert (snapshot["done"], snapshot["cancelled"], snapshot["status"]) == (
        True,
        False,
        "succeeded",
    )
    assert await event_kinds(child["runId"]) == []
    assert await adb(Command.objects.filter(method="run.cancel").count)() == 0


async def test_it_refuses_to_cancel_a_child_it_does_not_own(runner, make_client):
    child = await _child(runner)
    await runner.open("root-2")
    before = await state()
    for params in (
        runner.on_child(child, "root-2"),
        runner.on_child("c-unknown"),
        runner.on_child(child, generation=2),
        runner.on_child(child, extensionId="other"),
    ):
        error = await runner.error("child.cancel", params)
        assert error["code"] == -32003, (params, error)
    other = await make_client(await create_runner_async("runner-b"))
    await other.open("root-b")
    assert (await other.error("child.cancel", other.on_child(child, "root-b")))["code"] == -32003
    # Only runner-b's own run.open was added.
    after = await state()
    assert after["counts"]["Event"] == before["counts"]["Event"]
    assert after["counts"]["Command"] == before["counts"]["Command"]
    assert after["counts"]["AuditEntry"] == before["counts"]["AuditEntry"]
    assert await event_kinds(child["runId"]) == []


async def test_it_refuses_a_malformed_cancel(runner):
    child = await _child(runner)
    before = await state()
    for extra, field in (
        ({"childRunId": None}, "childRunId"),
        ({"reason": "x"}, "reason"),
        ({"childId": 1}, "childId"),
    ):
        error = await runner.error("child.cancel", runner.on_child(child, **extra))
        assert error["code"] == -32602 and field in error["message"]
    assert await state() == before


# --- child.steer -------------------------------------------------------------------------------


async def test_it_injects_a_steer_into_a_running_child(runner):
    child = await _child(runner)
    await runner.emit(child["runId"], ["working"])
    answer = await runner.ok(
        "child.steer", runner.on_child(child, message="focus on tests", requestId="s-1")
    )
    assert answer == {"outcome": "injected"}
    command = await runner.wait_command("run.steer", runId=child["runId"])
    assert command["params"] == {
        "runId": child["runId"],
        "requestId": "s-1",
        "message": "focus on tests",
    }
    read = await runner.read(child)
    assert [(e["sequence"], e["kind"], e.get("text")) for e in read["events"]] == [
        (1, "text", "working"),
        (2, "steer", "focus on tests"),
    ]
    receipt = await adb(SteerReceipt.objects.get)(request_id="s-1")
    assert (receipt.outcome, receipt.message) == ("injected", "focus on tests")
    assert await _audit("steer") == [{"target_id": child["runId"], "outcome": "injected"}]


async def test_it_answers_a_repeated_steer_with_the_stored_outcome(runner):
    child = await _child(runner)
    params = runner.on_child(child, message="m", requestId="s-1")
    assert await runner.ok("child.steer", params) == {"outcome": "injected"}
    await runner.wait_command("run.steer")
    before = await state()
    assert await runner.ok("child.steer", params) == {"outcome": "injected"}
    await runner.quiet(0.2)
    after = await state()
    assert after["counts"] == {**before["counts"], "AuditEntry": after["counts"]["AuditEntry"]}
    assert len(runner.commands_of("run.steer")) == 1
    # Still the stored outcome after the child has finished.
    await runner.finish(child["runId"])
    assert await runner.ok("child.steer", params) == {"outcome": "injected"}


async def test_it_refuses_a_reused_steer_request_id_with_another_message(runner):
    child = await _child(runner)
    await runner.ok("child.steer", runner.on_child(child, message="first", requestId="s-1"))
    await runner.wait_command("run.steer")
    before = await state()
    error = await runner.error(
        "child.steer", runner.on_child(child, message="second", requestId="s-1")
    )
    assert error["code"] == -32013
    assert await state() == before


@pytest.mark.parametrize("status", [{}, {"cancelled": True}, {"error": "x"}])
async def test_it_answers_prompt_required_when_no_turn_is_running(runner, status):
    child = await _child(runner)
    await runner.finish(child["runId"], **status)
    answer = await runner.ok(
        "child.steer", runner.on_child(child, message="hello?", requestId="s-1")
    )
    assert answer == {"outcome": "promptRequired", "reason": "noRunningTurn"}
    # Steer never starts a new turn: no event, no command, no new run.
    assert await event_kinds(child["runId"]) == []
    await runner.quiet(0.2)
    assert runner.commands_of("run.steer") == []
    read = await runner.read(child)
    assert read["done"] is True and read["events"] == []
    # The outcome is stored too.
    again = await runner.ok(
        "child.steer", runner.on_child(child, message="hello?", requestId="s-1")
    )
    assert again == answer


async def test_it_keeps_at_most_128_receipts_per_child(runner):
    child = await _child(runner)
    await runner.finish(child["runId"])  # promptRequired receipts: cheap, no commands
    for i in range(128):
        await runner.ok("child.steer", runner.on_child(child, message=f"m{i}", requestId=f"s{i}"))
    before = await state()
    error = await runner.error(
        "child.steer", runner.on_child(child, message="one more", requestId="s128")
    )
    assert error["code"] == -32011
    assert await state() == before
    # Replays of stored receipts still answer.
    again = await runner.ok("child.steer", runner.on_child(child, message="m5", requestId="s5"))
    assert again["outcome"] == "promptRequired"


async def test_it_counts_receipts_per_child(runner, settings):
    settings.DELEGATION_MAX_CONCURRENT = 20
    await runner.open("root-1")
    a = await runner.start(request_id="a")
    b = await runner.start(request_id="b")
    await runner.finish(a["runId"])
    await runner.finish(b["runId"])
    for i in range(128):
        await runner.ok("child.steer", runner.on_child(a, message="m", requestId=f"s{i}"))
    # The same requestIds on another child are that child's own receipts.
    answer = await runner.ok("child.steer", runner.on_child(b, message="other", requestId="s0"))
    assert answer["outcome"] == "promptRequired"


BAD_STEERS = [
    ({"message": "m", "requestId": ""}, "requestId"),
    ({"message": "m", "requestId": "a b"}, "requestId"),
    ({"message": "m", "requestId": "a/b"}, "requestId"),
    ({"message": "m", "requestId": ".."}, "requestId"),
    ({"message": "m", "requestId": "r" * 129}, "requestId"),
    ({"message": "m", "requestId": "a\u007f"}, "requestId"),
    ({"message": "m", "requestId": 5}, "requestId"),
    ({"message": "m"}, "requestId"),
    ({"requestId": "s"}, "message"),
    ({"message": "", "requestId": "s"}, "message"),
    ({"message": " \n\t", "requestId": "s"}, "message"),
    ({"message": "x" * 10_001, "requestId": "s"}, "message"),
    ({"message": "\u00e9" * 5001, "requestId": "s"}, "message"),
    ({"message": None, "requestId": "s"}, "message"),
    ({"message": ["m"], "requestId": "s"}, "message"),
    ({"message": "m", "requestId": "s", "priority": 1}, "priority"),
]


async def test_it_refuses_an_invalid_steer_with_32602(runner):
    child = await _child(runner)
    cases = [(runner.on_child(child, **extra), field) for extra, field in BAD_STEERS]
    await assert_all_refused(runner, "child.steer", cases, -32602)


async def test_it_accepts_a_steer_of_exactly_10000_bytes(runner):
    child = await _child(runner)
    message = "\u00e9" * 5000
    answer = await runner.ok("child.steer", runner.on_child(child, message=message, requestId="s"))
    assert answer["outcome"] == "injected"
    command = await runner.wait_command("run.steer")
    assert command["params"]["message"] == message


async def test_it_refuses_to_steer_a_child_it_does_not_own(runner_token, make_client):
    client = await make_client(
        runner_token,
        extensions=[
            DEFAULT_EXTENSION,
            {"extensionId": "ext2", "generation": 1, "presets": [{"name": "w"}]},
        ],
    )
    child = await _child(client)
    await client.open("root-2")
    before = await state()
    for params in (
        client.on_child(child, "root-2", message="m", requestId="s"),
        client.on_child("c-unknown", message="m", requestId="s"),
        client.on_child(child, generation=2, message="m", requestId="s"),
        client.on_child(child, extensionId="ext2", message="m", requestId="s"),
    ):
        error = await client.error("child.steer", params)
        assert error["code"] == -32003, (params, error)
    assert await state() == before


async def test_it_stores_the_runner_answer_to_a_run_steer(runner):
    child = await _child(runner)
    await runner.ok("child.steer", runner.on_child(child, message="m", requestId="s"))
    command = await runner.wait_command("run.steer")  # answered by the client on arrival
    # Frames are handled in order: once this read is answered, the steer answer was handled.
    await runner.read(child)
    stored = await adb(Command.objects.get)(method="run.steer")
    assert stored.answered_at is not None
    assert stored.result == {"outcome": "injected"}
    assert command["id"] == stored.rpc_id


async def test_it_resends_an_unanswered_run_steer_after_a_reconnect_only_until_answered(
    runner_token, make_client
):
    first = await make_client(runner_token)
    child = await _child(first)
    first.answer_commands = False
    await first.ok("child.steer", first.on_child(child, message="m", requestId="s"))
    sent = await first.wait_command("run.steer")
    # Unanswered: the next connection of the runner gets the same request again.
    second = await make_client(runner_token, register=False)
    second.answer_commands = False
    await second.register()
    again = await second.wait_command("run.steer")
    assert (again["id"], again["params"]) == (sent["id"], sent["params"])
    await second.send_raw(
        json.dumps({"jsonrpc": "2.0", "id": again["id"], "result": {"outcome": "injected"}})
    )
    await second.read(child)  # in order: the answer above was handled
    stored = await adb(Command.objects.get)(method="run.steer")
    assert stored.answered_at is not None and stored.result == {"outcome": "injected"}
    # Answered: a third connection does not get it. A command enqueued after the register is
    # sent by a flush that also claims every earlier unsent command, so once run.cancel has
    # arrived, a resent run.steer would have too.
    third = await make_client(runner_token)
    await third.ok("child.cancel", third.on_child(child))
    await third.wait_command("run.cancel", runId=child["runId"])
    assert third.commands_of("run.steer") == []

"""SPEC §5 run.finish and tool.end: ending runs, and foreground children dying with them."""

import pytest

from delegation.models import Run
from tests.support.rpc import adb, create_runner_async
from tests.support.state import assert_all_refused, event_kinds, state

pytestmark = pytest.mark.django_db(transaction=True)


async def _status(run_id: str) -> str:
    return (await adb(Run.objects.get)(run_id=run_id)).status


@pytest.mark.parametrize(
    "fields, status, done, cancelled, error, output",
    [
        ({}, "succeeded", True, False, "", ""),
        ({"output": "all done"}, "succeeded", True, False, "", "all done"),
        ({"error": "it broke"}, "failed", True, False, "it broke", ""),
        ({"cancelled": True}, "cancelled", True, True, "", ""),
        ({"cancelled": False, "output": "x"}, "succeeded", True, False, "", "x"),
    ],
)
async def test_it_finishes_a_run(runner, fields, status, done, cancelled, error, output):
    await runner.open("root-1")
    result = await runner.finish("root-1", **fields)
    assert result["runId"] == "root-1"
    assert (
        result["status"],
        result["done"],
        result["cancelled"],
        result["error"],
        result["output"],
    ) == (
        status,
        done,
        cancelled,
        error,
        output,
    )
    stored = await adb(Run.objects.get)(run_id="root-1")
    assert (stored.status, stored.done, stored.cancelled, stored.error, stored.output) == (
        status,
        done,
        cancelled,
        error,
        output,
    )


async def test_it_keeps_a_long_output_whole(runner):
    await runner.open("root-1")
    output = "o" * 200 * 1024
    assert (await runner.finish("root-1", output=output))["output"] == output


async def test_it_shows_a_finished_child_to_its_parent(runner):
    await runner.open("root-1")
    child = await runner.start()
    await runner.finish(child["runId"], output="the answer")
    read = await runner.read(child)
    assert read["done"] is True and read["status"] == "succeeded" and read["output"] == "the answer"


MALFORMED_FINISHES = [
    ({}, "runId"),
    ({"runId": "root-1", "output": None}, "output"),
    ({"runId": "root-1", "cancelled": "true"}, "cancelled"),
    ({"runId": "root-1", "cancelled": 1}, "cancelled"),
    ({"runId": "root-1", "error": 5}, "error"),
    ({"runId": "root-1", "status": "succeeded"}, "status"),
    ({"runId": "root-1", "Output": "x"}, "Output"),
]


async def test_it_refuses_a_malformed_run_finish(runner):
    await runner.open("root-1")
    await assert_all_refused(runner, "run.finish", MALFORMED_FINISHES, -32602)


async def test_it_refuses_to_finish_a_run_it_does_not_know(runner):
    await runner.open("root-1")
    before = await state()
    assert (await runner.error("run.finish", {"runId": "nope"}))["code"] == -32004
    assert (await runner.error("tool.end", {"runId": "nope", "toolCallId": "t"}))["code"] == -32004
    assert await state() == before


async def test_it_refuses_to_finish_another_runners_run(runner, make_client):
    await runner.open("root-1")
    other = await make_client(await create_runner_async("runner-b"))
    before = await state()
    assert (await other.error("run.finish", {"runId": "root-1"}))["code"] == -32004
    assert (await other.error("tool.end", {"runId": "root-1", "toolCallId": "t"}))["code"] == -32004
    assert await state() == before
    assert await _status("root-1") == "running"


MALFORMED_TOOL_ENDS = [
    ({"runId": "root-1"}, "toolCallId"),
    ({"toolCallId": "t"}, "runId"),
    ({"runId": "root-1", "toolCallId": 3}, "toolCallId"),
    ({"runId": "root-1", "toolCallId": "t", "reason": "x"}, "reason"),
]


async def test_it_refuses_a_malformed_tool_end(runner):
    await runner.open("root-1")
    await assert_all_refused(runner, "tool.end", MALFORMED_TOOL_ENDS, -32602)


async def test_it_cancels_foreground_children_when_the_parent_finishes(runner):
    await runner.open("root-1")
    fg1 = await runner.start(request_id="fg1")
    fg2 = await runner.start(request_id="fg2", tool_call="call-1")
    bg = await runner.start(request_id="bg", lease="L1")
    done = await runner.start(request_id="done")
    await runner.finish(done["runId"])
    await runner.finish("root-1")
    for child in (fg1, fg2):
        await runner.wait_command("run.cancel", runId=child["runId"])
        assert await event_kinds(child["runId"]) == ["cancel-requested"]
        # Cancel is requested; the run ends when the runner confirms.
        assert await _status(child["runId"]) == "running"
        await runner.finish(child["runId"], cancelled=True)
        assert await _status(child["runId"]) == "cancelled"
    assert runner.commands_of("run.cancel", runId=bg["runId"]) == []
    assert runner.commands_of("run.cancel", runId=done["runId"]) == []
    assert await event_kinds(bg["runId"]) == []
    assert await _status(bg["runId"]) == "running"


async def test_it_cancels_only_the_foreground_children_of_the_ended_tool_call(runner):
    await runner.open("root-1")
    a = await runner.start(request_id="a", tool_call="call-1")
    b = await runner.start(request_id="b", tool_call="call-2")
    c = await runner.start(request_id="c", tool_call="call-1", lease="L")
    await runner.ok("tool.end", {"runId": "root-1", "toolCallId": "call-1"})
    await runner.wait_command("run.cancel", runId=a["runId"])
    assert await event_kinds(a["runId"]) == ["cancel-requested"]
    assert await event_kinds(b["runId"]) == []
    assert await event_kinds(c["runId"]) == []
    assert runner.commands_of("run.cancel", runId=b["runId"]) == []
    assert runner.commands_of("run.cancel", runId=c["runId"]) == []
    assert await _status("root-1") == "running"


async def test_it_treats_a_repeated_tool_end_as_a_no_op(runner):
    await runner.open("root-1")
    child = await runner.start(tool_call="call-1")
    await runner.ok("tool.end", {"runId": "root-1", "toolCallId": "call-1"})
    await runner.wait_command("run.cancel", runId=child["runId"])
    before = await state()
    await runner.ok("tool.end", {"runId": "root-1", "toolCallId": "call-1"})
    after = await state()
    assert after["counts"] == before["counts"]
    assert await event_kinds(child["runId"]) == ["cancel-requested"]


async def test_it_refuses_child_calls_on_a_finished_parent_without_a_lease(runner):
    await runner.open("root-1")
    child = await runner.start()
    await runner.finish("root-1")
    await runner.wait_command("run.cancel", runId=child["runId"])
    await runner.finish(child["runId"], cancelled=True)
    before = await state()
    assert (await runner.error("child.start", runner.child_params(request_id="late")))[
        "code"
    ] == -32014
    assert (await runner.error("child.read", runner.on_child(child)))["code"] == -32014
    assert (await runner.error("child.cancel", runner.on_child(child)))["code"] == -32014
    steer = await runner.error("child.steer", runner.on_child(child, message="m", requestId="s"))
    assert steer["code"] == -32014
    assert await state() == before


async def test_it_cascades_a_cancel_through_a_cancelled_child_to_its_foreground_children(runner):
    await runner.open("root-1")
    child = await runner.start()
    grandchild = await runner.start(child["runId"], request_id="g")
    cancel = await runner.ok("child.cancel", runner.on_child(child))
    assert cancel["done"] is False
    await runner.wait_command("run.cancel", runId=child["runId"])
    # The runner stops the child; the child's foreground children go with it.
    await runner.finish(child["runId"], cancelled=True)
    await runner.wait_command("run.cancel", runId=grandchild["runId"])
    assert await event_kinds(grandchild["runId"]) == ["cancel-requested"]

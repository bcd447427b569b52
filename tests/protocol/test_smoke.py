import pytest
from channels.db import database_sync_to_async

from delegation.wire import Result

pytestmark = pytest.mark.django_db(transaction=True)


async def test_it_registers_opens_and_starts_a_child(runner):
    root = await runner.open("root-1")
    assert root["depth"] == 0 and root["status"] == "running"
    child = await runner.ok("child.start", runner.child_params())
    assert child["depth"] == 1
    execute = await runner.wait_command("child.execute")
    assert execute["params"]["identity"]["runId"] == child["runId"]
    stored = await runner.ok(
        "run.event",
        {"runId": child["runId"], "from": 1, "events": [{"kind": "text", "text": "hi"}]},
    )
    assert stored == {"emitted": 1, "sequence": 1}
    # Every Result field is present with its type, and nothing else (SPEC §6).
    for snapshot in (root, child):
        assert Result.model_validate(snapshot).model_dump(by_alias=True) == snapshot
    read = await runner.ok(
        "child.read",
        {
            "runId": "root-1",
            "extensionId": "ext",
            "generation": 1,
            "childId": child["conversationId"],
        },
    )
    assert read["events"] == [{"sequence": 1, "kind": "text", "text": "hi"}]


async def test_it_refuses_a_nul_character_naming_the_field_and_stores_nothing(runner):
    await runner.open("root-1")
    frame = await runner.call(
        "run.event",
        {"runId": "root-1", "from": 1, "events": [{"kind": "text", "text": "a\u0000b"}]},
    )
    assert frame["id"] is not None
    assert frame["error"]["code"] == -32602
    assert "params.events[0].text" in frame["error"]["message"]
    stored = await runner.ok(
        "run.event", {"runId": "root-1", "from": 1, "events": [{"kind": "text", "text": "ab"}]}
    )
    assert stored == {"emitted": 1, "sequence": 1}


async def test_it_marks_lost_the_runs_of_a_host_instance_that_was_replaced(runner):
    await runner.open("root-1")
    runner.answer_commands = False  # the old process dies before it accepts the child
    child = await runner.ok("child.start", runner.child_params())
    await runner.wait_command("child.execute")
    await runner.register(host="host-2")  # the runner process restarted within the grace
    snapshot = await runner.ok("run.open", {"conversationId": "conv-root-2", "runId": "root-2"})
    assert snapshot["status"] == "running" and snapshot["hostInstanceId"] == "host-2"
    from delegation.models import Command, Run

    def states():
        return {
            r.run_id: (r.status, r.error, r.done)
            for r in Run.objects.filter(runner__name="runner-a")
        }

    found = await database_sync_to_async(states)()
    assert found["root-1"][0] == "lost" and found["root-1"][2] is True
    assert "host instance host-1 was replaced by host-2" in found["root-1"][1]
    assert found[child["runId"]][0] == "lost"
    assert found["root-2"][0] == "running"
    unanswered = await database_sync_to_async(
        lambda: Command.objects.filter(run__run_id=child["runId"], answered_at__isnull=True).count()
    )()
    assert unanswered == 0
    # Nothing of the old process is redelivered to the new one.
    executes = [c for c in runner.commands if c["method"] == "child.execute"]
    assert len(executes) == 1


async def test_it_keeps_runs_when_the_same_host_instance_registers_again(runner):
    await runner.open("root-1")
    await runner.register(host="host-1")
    read = await runner.ok("run.open", {"conversationId": "conv-root-1", "runId": "root-1"})
    assert read["status"] == "running"

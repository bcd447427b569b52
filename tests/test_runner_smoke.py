import pytest

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

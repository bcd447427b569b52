"""Issue 15, runner protocol findings: what a hostile runner may not do over a real socket.

7: a finished run cannot be rewritten; 11: another runner's ids are answered like ids in use;
17: a generation past 2^63-1 is refused by the schema, naming the field.
"""

from __future__ import annotations

import pytest

from delegation import models
from tests.support.rpc import adb, create_runner_async
from tests.support.state import state

pytestmark = pytest.mark.django_db(transaction=True)


def _run(run_id: str):
    return models.Run.objects.get(run_id=run_id)


async def test_it_refuses_new_events_after_run_finish_but_answers_exact_replays(runner):
    await runner.open("root-1")
    await runner.emit("root-1", ["one", {"kind": "result", "text": "the answer"}])
    await runner.finish("root-1", output="the answer")

    replay = await runner.ok(
        "run.event",
        {
            "runId": "root-1",
            "from": 1,
            "events": [{"kind": "text", "text": "one"}, {"kind": "result", "text": "the answer"}],
        },
    )
    assert replay == {"emitted": 2, "sequence": 2}

    before = await state()
    for events, start in (
        ([{"kind": "result", "text": "forged"}], 3),
        (
            [
                {"kind": "text", "text": "one"},
                {"kind": "result", "text": "the answer"},
                {"kind": "result", "text": "forged"},
            ],
            1,
        ),
    ):
        error = await runner.error(
            "run.event", {"runId": "root-1", "from": start, "events": events}
        )
        assert error["code"] == -32014, error
        assert "root-1" in error["message"] and "succeeded" in error["message"]
    assert await state() == before
    run = await adb(_run)("root-1")
    assert (run.output, run.emitted, run.status) == ("the answer", 2, "succeeded")


async def test_it_answers_another_runners_conversation_like_an_id_in_use(runner, make_client):
    await runner.open("root-1", conversation_id="conv-secret")
    other = await make_client(await create_runner_async("runner-b"))

    taken_run = await other.error("run.open", {"conversationId": "conv-new", "runId": "root-1"})
    foreign_conv = await other.error(
        "run.open", {"conversationId": "conv-secret", "runId": "root-9"}
    )
    assert taken_run["code"] == foreign_conv["code"] == -32602
    assert "already in use" in taken_run["message"]
    assert foreign_conv["message"] == "conversationId: 'conv-secret' is already in use"
    assert await adb(models.Session.objects.filter(conversation_id="conv-secret").count)() == 1
    assert not await adb(models.Run.objects.filter(run_id="root-9").exists)()


@pytest.mark.parametrize("generation", [2**63, 2**64 + 5])
async def test_it_refuses_a_generation_past_bigint_naming_the_field(runner, generation):
    await runner.open("root-1")
    before = await state()
    params = runner.start_params()
    params["generation"] = generation
    error = await runner.error("child.start", params)
    assert error["code"] == -32602, error
    assert "generation" in error["message"] and "2^63-1" in error["message"]
    assert await state() == before

"""Pipelined ``run.event`` frames committed together (issue 26): a runner that sends without
waiting gets every frame answered on its own, in order, each stored or refused exactly as
it would be alone, while the server commits the frames waiting behind each other at once.

The groups are observed by wrapping ``methods.append_event_frames_of``, which every commit of
``run.event`` frames goes through: each test first checks that a group really formed, so it
can fail if none did.
"""

import json

import pytest
from django.db import IntegrityError, transaction

from delegation import notify
from delegation.models import Event, Run, RunRollup
from delegation.runner_socket import methods
from delegation.services import event_store, streams
from delegation.services.identity import Connection
from delegation.wire import RunEventParams, parse_model
from tests.support.rpc import adb

pytestmark = pytest.mark.django_db(transaction=True)


def _record(monkeypatch, module, name: str) -> list[list]:
    """Wrap ``module.name(items)`` and record the items of each call."""
    calls: list[list] = []
    real = getattr(module, name)

    def recorded(items):
        calls.append(list(items))
        return real(items)

    monkeypatch.setattr(module, name, recorded)
    return calls


@pytest.fixture
def commits(monkeypatch) -> list[list]:
    """The (connection, frames) of each commit of run.event frames, all sockets together."""
    return _record(monkeypatch, methods, "append_event_frames_of")


def largest(commits) -> int:
    return max((sum(len(frames) for _conn, frames in call) for call in commits), default=0)


def frame(rpc_id, run_id, start, *events) -> str:
    params = {"runId": run_id, "from": start, "events": list(events)}
    body = {"jsonrpc": "2.0", "method": "run.event", "params": params}
    if rpc_id is not None:
        body["id"] = rpc_id
    return json.dumps(body)


def text(value: str) -> dict:
    return {"kind": "text", "text": value}


async def _stream(run_id: str) -> list[tuple]:
    return await adb(
        lambda: list(
            Event.objects.filter(run__run_id=run_id)
            .order_by("sequence")
            .values_list("sequence", "runner_index", "text")
        )
    )()


async def _answers(runner, count: int) -> list[dict]:
    return [await runner.next_response() for _ in range(count)]


async def test_it_answers_every_pipelined_frame_in_order_from_one_commit(runner, commits):
    await runner.open("root-1")
    for index in range(1, 41):
        await runner.send_raw(frame(index, "root-1", index, text(f"e{index}")))
    answers = await _answers(runner, 40)
    assert [a["id"] for a in answers] == list(range(1, 41))
    assert [a["result"] for a in answers] == [{"emitted": i, "sequence": i} for i in range(1, 41)]
    assert largest(commits) > 1, commits  # the frames behind the first did go together
    assert await _stream("root-1") == [(i, i, f"e{i}") for i in range(1, 41)]


async def test_it_refuses_a_frame_of_a_group_alone_and_keeps_the_rest(runner, commits):
    await runner.open("root-1")
    await runner.emit("root-1", ["a"])
    # The first frame waits behind a slow one (many events) so the others queue behind it.
    await runner.send_raw(frame(1, "root-1", 2, *[text(f"b{i}") for i in range(200)]))
    await runner.send_raw(frame(2, "root-1", 500, text("gap")))  # a gap: refused
    await runner.send_raw(frame(3, "root-1", 202, text("c")))
    await runner.send_raw(frame(4, "root-1", 203, {"kind": "delegation-refused", "text": "x"}))
    await runner.send_raw(frame(None, "root-1", 203, text("d")))  # a notification
    await runner.send_raw(frame(5, "root-1", 1, text("not a")))  # a conflicting replay
    await runner.send_raw(frame(6, "root-1", 204, text("e")))
    await runner.send_raw(frame(7, "nobody", 1, text("f")))  # not a run of this runner
    await runner.send_raw(frame(8, "root-1", 205, {"kind": "text", "text": 5}))  # malformed
    await runner.send_raw(frame(9, "root-1", 205, text("g")))
    answers = {a["id"]: a for a in await _answers(runner, 9)}
    assert largest(commits) > 1, commits
    assert answers[1]["result"] == {"emitted": 201, "sequence": 201}
    assert answers[2]["error"]["code"] == -32602 and "from: 500 leaves a gap" in str(answers[2])
    assert answers[3]["result"] == {"emitted": 202, "sequence": 202}
    assert "reserved for the server" in answers[4]["error"]["message"]
    assert "conflicts with the stored event number 1" in answers[5]["error"]["message"]
    assert answers[6]["result"] == {"emitted": 204, "sequence": 204}
    assert answers[7]["error"]["code"] == -32004
    assert answers[8]["error"]["code"] == -32602 and "events[0].text" in str(answers[8])
    assert answers[9]["result"] == {"emitted": 205, "sequence": 205}
    stream = await _stream("root-1")
    assert [row[2] for row in stream[-4:]] == ["c", "d", "e", "g"]
    assert [row[0] for row in stream] == list(range(1, 206))  # gap-free, nothing twice


async def test_it_commits_frames_of_several_sockets_together(runner, make_client, commits):
    from tests.support.rpc import create_runner_async

    other = await make_client(await create_runner_async("runner-b"))
    await runner.open("root-a")
    await other.open("root-b")
    # Each socket's first frame is slow (many events), so the other's frames wait behind it.
    for client, run_id in ((runner, "root-a"), (other, "root-b")):
        await client.send_raw(frame(1, run_id, 1, *[text(f"x{i}") for i in range(300)]))
    for index in range(2, 31):
        for client, run_id in ((runner, "root-a"), (other, "root-b")):
            await client.send_raw(frame(index, run_id, 299 + index, text(f"{run_id}-{index}")))
    for client, run_id in ((runner, "root-a"), (other, "root-b")):
        answers = await _answers(client, 30)
        assert [a["id"] for a in answers] == list(range(1, 31))
        assert [a["result"]["emitted"] for a in answers] == [300, *range(301, 330)]
        stream = await _stream(run_id)
        assert [row[0] for row in stream] == list(range(1, 330))
        assert stream[-1][2] == f"{run_id}-30"
    shared = [call for call in commits if len({conn.runner_pk for conn, _ in call}) > 1]
    assert shared, commits  # at least one commit held both runners' frames


async def test_it_keeps_one_sockets_failing_frame_from_failing_anothers(
    runner, make_client, commits, monkeypatch
):
    from tests.support.rpc import create_runner_async

    real_insert = event_store.insert_events

    def insert_unless_poisoned(values):
        if any(row["text"] == "poison" for *_fields, row in values):
            raise IntegrityError("a row the database refuses")
        return real_insert(values)

    monkeypatch.setattr(event_store, "insert_events", insert_unless_poisoned)
    other = await make_client(await create_runner_async("runner-b"))
    await runner.open("root-a")
    await other.open("root-b")
    await runner.send_raw(frame(1, "root-a", 1, *[text(f"x{i}") for i in range(300)]))
    await other.send_raw(frame(1, "root-b", 1, *[text(f"x{i}") for i in range(300)]))
    for index in range(2, 61):
        await runner.send_raw(frame(index, "root-a", 299 + index, text(f"a{index}")))
        if index < 20:
            await other.send_raw(frame(index, "root-b", 299 + index, text(f"b{index}")))
    await other.send_raw(frame(20, "root-b", 319, text("poison")))
    answers = await _answers(runner, 60)
    assert [a["result"]["emitted"] for a in answers] == [300, *range(301, 360)]
    # The other socket's frames handed in with the poison (one call) fail with it, as they
    # would alone; those before it are stored.
    theirs = await _answers(other, 20)
    stored = [a for a in theirs if "result" in a]
    assert theirs[: len(stored)] == stored and stored, theirs
    assert [a["result"]["emitted"] for a in stored] == [300, *range(301, 299 + len(stored))]
    assert {a["error"]["code"] for a in theirs[len(stored) :]} == {-32603}
    poisoned = [
        call
        for call in commits
        if len(call) > 1 and any("poison" in json.dumps(frames) for _conn, frames in call)
    ]
    assert poisoned, commits  # the poison did meet the other socket's frames in one commit
    assert len(await _stream("root-a")) == 359
    assert len(await _stream("root-b")) == 299 + len(stored)


async def test_it_checks_a_replay_against_events_of_the_same_group(runner, commits):
    await runner.open("root-1")
    await runner.send_raw(frame(1, "root-1", 1, *[text(f"a{i}") for i in range(200)]))
    await runner.send_raw(frame(2, "root-1", 201, text("b"), text("c")))
    await runner.send_raw(frame(3, "root-1", 202, text("c"), text("d")))  # replays c
    await runner.send_raw(frame(4, "root-1", 203, text("not d")))  # conflicts with d
    await runner.send_raw(frame(5, "root-1", 201, text("b"), text("c"), text("d")))
    answers = {a["id"]: a for a in await _answers(runner, 5)}
    assert largest(commits) > 1, commits
    assert answers[2]["result"] == {"emitted": 202, "sequence": 202}
    assert answers[3]["result"] == {"emitted": 203, "sequence": 203}
    assert "conflicts with the stored event number 203" in answers[4]["error"]["message"]
    assert answers[5]["result"] == {"emitted": 203, "sequence": 203}
    stream = await _stream("root-1")
    assert [row[2] for row in stream[-3:]] == ["b", "c", "d"] and len(stream) == 203


async def test_it_adds_pipelined_usage_once_and_stops_the_budget_after_the_commit(
    runner, commits, monkeypatch
):
    transactions = _record(monkeypatch, streams, "_append_group")
    await runner.open("root-1", budget={"maxTokens": 100})
    usage = {"kind": "usage", "input": {"inputTokens": 10, "outputTokens": 5}}
    for index in range(1, 11):  # 150 tokens in all: the budget is crossed on the seventh
        await runner.send_raw(frame(index, "root-1", 2 * index - 1, text(f"t{index}"), usage))
    answers = await _answers(runner, 10)
    assert [a["result"]["emitted"] for a in answers] == [2 * i for i in range(1, 11)]
    assert largest(commits) > 1, commits
    # A frame with usage ends its transaction (the rollup rows are the last locks).
    assert transactions and {len(group) for group in transactions} == {1}, transactions
    await runner.wait_command("run.cancel", runId="root-1")
    rollup = await adb(lambda: RunRollup.objects.get(run__run_id="root-1"))()
    assert (rollup.own_tokens_in, rollup.own_tokens_out, rollup.own_usage_events) == (100, 50, 10)
    run = await adb(lambda: Run.objects.get(run_id="root-1"))()
    assert run.cancel_reason.startswith("budget exceeded: maxTokens")


async def test_it_commits_each_frame_as_a_group_of_one_with_a_limit_of_one(
    runner, commits, settings
):
    settings.RUN_EVENT_GROUP_MAX = 1
    await runner.open("root-1")
    for index in range(1, 21):
        await runner.send_raw(frame(index, "root-1", index, text(f"e{index}")))
    answers = await _answers(runner, 20)
    assert [a["result"]["emitted"] for a in answers] == list(range(1, 21))
    # The same one path, never a second one: every frame a commit of its own.
    assert [[len(frames) for _conn, frames in call] for call in commits] == [[1]] * 20


async def test_it_rings_once_for_a_group_carrying_all_its_events(runner):
    opened = await runner.open("root-1")
    assert opened["runId"] == "root-1"
    conn = await adb(lambda: _connection_of("root-1"))()
    frames = [
        parse_model(RunEventParams, {"runId": "root-1", "from": i, "events": [text(f"e{i}")]})
        for i in (1, 2, 3)
    ]

    def commit():
        with notify.collect() as bells, transaction.atomic():
            [outcomes] = streams.append_event_frames_of([(conn, frames)])
        return outcomes, bells

    outcomes, bells = await adb(commit)()
    assert [o["emitted"] for o in outcomes] == [1, 2, 3]
    pk = await adb(lambda: Run.objects.get(run_id="root-1").pk)()
    rung = bells[(notify.run_group(pk), pk)]
    assert [e["sequence"] for e in rung["events"]] == [1, 2, 3]
    assert rung["sequence"] == 3
    assert "events" not in bells[(notify.tree_group(pk), pk)]


def _connection_of(run_id: str) -> Connection:
    runner = Run.objects.select_related("runner").get(run_id=run_id).runner
    return Connection(runner_pk=runner.pk, generation=runner.connection_generation)

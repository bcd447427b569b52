"""The operator live socket /ws/live/ over real WebSocket frames into the ASGI app, real DB.

A runner (tests.support.rpc's JSON-RPC client) writes through the runner socket; an operator socket
subscribes and must see every event once, in sequence order, whatever the channel layer drops.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.db import database_sync_to_async

from dashboard.live import frames as live_frames
from dashboard.live import runs as live_runs
from delegation import models, notify, protocol
from delegation.services.run_actions import Actor, do_cancel_run
from tests.support.live import ORIGIN, check_frames, frame, live_socket, operator_socket, until
from tests.support.personas import api_token, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def event_sequences(frames, run_id) -> list[int]:
    return [
        e["sequence"]
        for f in frames
        if f["type"] == "events" and f["runId"] == run_id
        for e in f["events"]
    ]


def head_reached(run_id, sequence):
    return lambda f: (
        f["type"] == "events" and f["runId"] == run_id and (f["events"][-1]["sequence"] >= sequence)
    )


# Long enough that the events above come by doorbell, well before the first heartbeat (which
# would catch up from the database, and comes after half a period at the soonest); short
# enough to wait for one after the head.
HEARTBEAT = 4.0


async def through_heartbeat(ws, run_id, sequence) -> list[dict]:
    """Frames up to ``sequence`` of ``run_id``, then on to the next heartbeat that reports it.

    A heartbeat comes after a catch-up from the database with every earlier job done, so a
    duplicated or stray batch sent after the head would be among these frames.
    """
    frames = await until(ws, head_reached(run_id, sequence))
    assert not [f for f in frames if f["type"] == "heartbeat"], "head came by heartbeat"
    frames += await until(
        ws,
        lambda f: f["type"] == "heartbeat" and f["runs"].get(run_id, -1) >= sequence,
        timeout=HEARTBEAT * 3,
    )
    return frames


async def emit(runner, run_id, start, *texts):
    return await runner.ok(
        "run.event",
        {"runId": run_id, "from": start, "events": [{"kind": "text", "text": t} for t in texts]},
    )


async def test_it_replays_from_after_then_pushes_new_events_in_order(runner, operator, settings):
    settings.LIVE_HEARTBEAT_SECONDS = HEARTBEAT
    await runner.open("root-1")
    await emit(runner, "root-1", 1, "one", "two", "three")
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "runId": "root-1", "after": 1})
    frames = await until(ws, head_reached("root-1", 3))
    await emit(runner, "root-1", 4, "four")
    await emit(runner, "root-1", 5, "five", "six")
    frames += await through_heartbeat(ws, "root-1", 6)
    assert event_sequences(frames, "root-1") == [2, 3, 4, 5, 6]
    texts = [e["text"] for f in frames if f["type"] == "events" for e in f["events"]]
    assert texts == ["two", "three", "four", "five", "six"]
    state = [f for f in frames if f["type"] == "run"][-1]["run"]
    assert state["runId"] == "root-1" and state["status"] == "running" and state["depth"] == 0
    check_frames(frames)
    await ws.disconnect()


async def test_it_spreads_the_heartbeats_of_sockets_opened_together(operator, settings):
    """Issue 39: sockets opened at once (a restart's reconnections) beat at once every period,
    re-checking and catching up together while runners' frames wait behind them."""
    settings.LIVE_HEARTBEAT_SECONDS = 1.0
    sockets = []
    for _ in range(12):
        sockets.append((await operator_socket(operator), time.monotonic()))  # after its hello

    async def first_beat(ws, hello: float) -> float:
        await until(ws, lambda f: f["type"] == "heartbeat", timeout=5)
        return time.monotonic() - hello

    beats = await asyncio.gather(*(first_beat(ws, hello) for ws, hello in sockets))
    # Each between a half and one period after its hello, at its own point of that half (12
    # points of half a second all within 0.15 s of each other: about 15 in a million).
    assert all(0.45 <= beat <= 1.5 for beat in beats), beats
    assert max(beats) - min(beats) >= 0.15, beats
    for ws, _ in sockets:
        await ws.disconnect()


async def test_it_catches_up_from_the_database_when_every_doorbell_is_lost(
    runner, settings, monkeypatch, operator
):
    settings.LIVE_HEARTBEAT_SECONDS = 0.3
    await runner.open("root-1")
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "runId": "root-1", "after": 0})
    await until(ws, lambda f: f["type"] == "run")

    # From now on the channel layer drops every ring, as channels-redis does over capacity.
    async def dropped(*args, **kwargs):
        return None

    monkeypatch.setattr(notify, "_send", lambda group, message: None)
    monkeypatch.setattr(notify, "ring_collected", dropped, raising=False)
    await emit(runner, "root-1", 1, "a", "b")
    await emit(runner, "root-1", 3, "c")
    frames = await until(ws, head_reached("root-1", 3))
    # One more heartbeat after the head: nothing sent twice on the way.
    frames += await until(ws, lambda f: f["type"] == "heartbeat")
    assert event_sequences(frames, "root-1") == [1, 2, 3]
    assert frames[-1]["runs"] == {"root-1": 3}
    check_frames(frames)
    await ws.disconnect()


async def test_it_reads_the_database_when_a_doorbell_with_events_goes_missing(
    runner, monkeypatch, operator, settings
):
    settings.LIVE_HEARTBEAT_SECONDS = HEARTBEAT
    await runner.open("root-1")
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "runId": "root-1", "after": 0})
    await until(ws, lambda f: f["type"] == "run")
    real_ring = notify.ring_collected
    calls = []

    async def lose_the_second(bells):
        calls.append(bells)
        if len(calls) != 2:
            await real_ring(bells)

    monkeypatch.setattr(notify, "ring_collected", lose_the_second)
    await emit(runner, "root-1", 1, "a")  # carried: follows sequence 0
    await emit(runner, "root-1", 2, "b", "c")  # its ring is lost
    await emit(runner, "root-1", 4, "d")  # carried, but 2-3 are missing: read instead
    frames = await through_heartbeat(ws, "root-1", 4)
    assert len(calls) == 3
    assert event_sequences(frames, "root-1") == [1, 2, 3, 4]
    texts = [e["text"] for f in frames if f["type"] == "events" for e in f["events"]]
    assert texts == ["a", "b", "c", "d"]
    await ws.disconnect()


async def test_it_resumes_after_a_dropped_socket_with_the_last_sequence(runner, operator, settings):
    settings.LIVE_HEARTBEAT_SECONDS = HEARTBEAT
    await runner.open("root-1")
    await emit(runner, "root-1", 1, "a", "b", "c")
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "runId": "root-1", "after": 0})
    first = event_sequences(await until(ws, head_reached("root-1", 3)), "root-1")
    await ws.disconnect()
    await emit(runner, "root-1", 4, "d", "e")  # written while the operator is away
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "runId": "root-1", "after": first[-1]})
    await emit(runner, "root-1", 6, "f")
    second = event_sequences(await through_heartbeat(ws, "root-1", 6), "root-1")
    assert first + second == [1, 2, 3, 4, 5, 6]
    await ws.disconnect()


@pytest.mark.parametrize(
    ("sent", "field", "words"),
    [
        ('{"type": "subscribe", "runId": "r", "after": "1"}', "after", "integer"),
        ('{"type": "subscribe", "runId": "r", "after": -1}', "after", "greater than or equal"),
        ('{"type": "subscribe", "runId": "r", "apiKey": "x"}', "apiKey", "unknown field"),
        ('{"type": "subscribe", "runId": null}', "runId", "null"),
        ('{"type": "subscribe", "runId": "a/b"}', "runId", "'/'"),
        ('{"type": "subscribe", "runId": "r", "runId": "s"}', "", "duplicate key"),
        ('{"type": "subscribe"}', "runId", "exactly one"),
        ('{"type": "watch", "runId": "r"}', "type", "must be"),
        ('{"type": "subscribe", "runId": "r"} trailing', "", "parse error"),
        ('{"type": "subscribe", "runId": "nope"}', "runId", "no run"),
    ],
)
async def test_it_refuses_a_bad_frame_naming_the_field(sent, field, words, operator):
    ws = await operator_socket(operator)
    await ws.send_to(text_data=sent)
    error = await frame(ws)
    assert error["type"] == "error", error
    assert error["field"] == field, error
    assert words in error["message"], error
    live_frames.ErrorFrame.model_validate(error)
    # The socket stays usable after a refused frame.
    await ws.send_json_to({"type": "ping"})
    assert (await frame(ws)) == {"type": "pong"}
    await ws.disconnect()


async def test_it_checks_session_origin_role_and_bearer_tokens(operator, outsider, viewer):
    # Not signed in: accepted, then closed with 4401.
    ws = live_socket([ORIGIN])
    assert (await ws.connect(timeout=10))[0]
    assert (await ws.receive_output(timeout=5))["code"] == protocol.CLOSE_UNAUTHORIZED
    # A session from another origin (a cross-site hijack) is refused at the handshake.
    cookie = await database_sync_to_async(session_cookie)(operator)
    ws = live_socket([(b"origin", b"http://evil.example"), (b"cookie", cookie)])
    assert not (await ws.connect(timeout=10))[0]
    # A session without an Origin header is refused too.
    ws = live_socket([(b"cookie", cookie)])
    assert not (await ws.connect(timeout=10))[0]
    # Signed in but without a role: 4403.
    cookie = await database_sync_to_async(session_cookie)(outsider)
    ws = live_socket([ORIGIN, (b"cookie", cookie)])
    assert (await ws.connect(timeout=10))[0]
    assert (await ws.receive_output(timeout=5))["code"] == protocol.CLOSE_FORBIDDEN
    # A script with an API token needs no Origin; a wrong token is refused.
    token = await database_sync_to_async(api_token)(viewer)
    ws = live_socket([(b"authorization", f"Bearer {token}".encode())])
    assert (await ws.connect(timeout=10))[0]
    hello = await frame(ws)
    assert hello["user"] == "vera" and hello["role"] == "viewer" and hello["canAct"] is False
    await ws.disconnect()
    ws = live_socket([(b"authorization", b"Bearer cna_wrong")])
    assert (await ws.connect(timeout=10))[0]
    assert (await ws.receive_output(timeout=5))["code"] == protocol.CLOSE_UNAUTHORIZED


async def test_it_streams_a_tree_as_it_grows_and_changes(runner, operator):
    await runner.open("root-1")
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "treeId": "root-1"})
    frames = await until(ws, lambda f: f["type"] == "tree" and not f["more"])
    assert [r["runId"] for r in frames[-1]["runs"]] == ["root-1"]
    child = await runner.ok("child.start", runner.child_params())
    rows = await until(
        ws, lambda f: f["type"] == "rows" and any(r["runId"] == child["runId"] for r in f["runs"])
    )
    row = next(r for r in rows[-1]["runs"] if r["runId"] == child["runId"])
    assert row["parentRunId"] == "root-1" and row["depth"] == 1 and row["status"] == "running"
    await runner.ok("run.finish", {"runId": child["runId"], "output": "done"})
    rows = await until(
        ws,
        lambda f: (
            f["type"] == "rows"
            and any(r["runId"] == child["runId"] and r["status"] == "succeeded" for r in f["runs"])
        ),
    )
    check_frames(frames + rows)
    await ws.disconnect()


async def test_it_marks_refused_spawns_and_cancel_requests_on_tree_rows(runner, settings, operator):
    settings.DELEGATION_MAX_DEPTH = 1
    await runner.open("root-1")
    child = await runner.ok("child.start", runner.child_params())
    grandchild = runner.child_params(run_id=child["runId"], request_id="deep")
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "treeId": "root-1"})
    await until(ws, lambda f: f["type"] == "tree" and not f["more"])
    assert (await runner.error("child.start", grandchild))["code"] == -32010
    rows = await until(
        ws,
        lambda f: (
            f["type"] == "rows"
            and any(r["runId"] == child["runId"] and r["refusedSpawns"] == 1 for r in f["runs"])
        ),
    )
    assert rows
    run = await database_sync_to_async(models.Run.objects.get)(run_id=child["runId"])
    await database_sync_to_async(do_cancel_run)(
        Actor.for_user(operator, via="dashboard"), run, reason="test"
    )
    await until(
        ws,
        lambda f: (
            f["type"] == "rows"
            and any(r["runId"] == child["runId"] and r["cancelRequested"] for r in f["runs"])
        ),
    )
    await ws.disconnect()


async def test_it_sends_overview_summaries_and_announces_new_trees(runner, operator):
    await runner.open("root-1")
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "roots": ["root-1"], "newTrees": True})
    first = (await until(ws, lambda f: f["type"] == "summary"))[-1]
    assert first["treeId"] == "root-1" and first["runs"] == 1 and first["maxDepth"] == 0
    # A tree announced live shows its identity from the summary alone.
    assert first["runnerId"] == "runner-a" and first["conversationId"] == "conv-root-1"
    await runner.ok("child.start", runner.child_params())
    summary = (await until(ws, lambda f: f["type"] == "summary" and f["runs"] == 2))[-1]
    assert summary["counts"] == {"running": 2} and summary["maxDepth"] == 1
    await runner.open("root-2")
    announced = await until(ws, lambda f: f["type"] == "newTree")
    assert announced[-1]["treeId"] == "root-2"
    check_frames([first, summary, announced[-1]])
    await ws.disconnect()


async def test_it_sends_the_head_alone_at_most_once_a_second(
    runner, operator, settings, monkeypatch
):
    """Read from the database on every doorbell (a layer that does not vouch for what it
    carries), twenty events make twenty reads; their run frames differ only in the head, which
    goes at most once a second. A change of anything else goes at once, and the head itself by
    the next heartbeat at the latest."""
    settings.LIVE_HEARTBEAT_SECONDS = HEARTBEAT
    monkeypatch.setattr(live_runs, "vouches_for_content", lambda layer: False)
    await runner.open("root-1")
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "runId": "root-1", "after": 0})
    await until(ws, lambda f: f["type"] == "run")
    started = time.monotonic()
    for n in range(1, 21):
        await emit(runner, "root-1", n, f"e{n}")
    emitting = time.monotonic() - started
    frames = await through_heartbeat(ws, "root-1", 20)
    assert event_sequences(frames, "root-1") == list(range(1, 21))
    runs = [f["run"] for f in frames if f["type"] == "run"]
    # One a second while emitting, and the head the heartbeat's catch-up found.
    assert len(runs) <= int(emitting) + 2, (len(runs), emitting)
    assert runs[-1]["lastSequence"] == 20

    await runner.finish("root-1", output="done")
    finished = await until(
        ws, lambda f: f["type"] == "run" and f["run"]["status"] == "succeeded", timeout=2
    )
    assert not [f for f in finished if f["type"] == "heartbeat"], "the status waited"
    await ws.disconnect()

"""Concurrency (issue 2): parallel writers on one run and one parent.

The tests marked ``parallel_writers`` need a database with row locks and truly parallel
transactions: they run on PostgreSQL (`.ci/run`'s second pass sets DATABASE_URL, and
`make test-postgres` does too) and are skipped on SQLite, which has one write lock per file.
The socket test at the end runs on both backends.

Threads call the same service functions the runner socket calls, each on its own database
connection (closed when the thread ends), released together by a barrier.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connections

from delegation.errors import RpcError
from delegation.models import Command, Event, Lease, Run, SteerReceipt
from delegation.runner_socket import methods
from delegation.services import runners
from tests.support.concurrency import (
    in_threads,
    on_child,
    parallel_writers,
    service_connection,
    start_params,
)
from tests.support.rpc import adb

pytestmark = pytest.mark.django_db(transaction=True)


def _stream(run_id: str) -> list[Event]:
    return list(Event.objects.filter(run__run_id=run_id).order_by("sequence"))


def assert_gap_free(run_id: str) -> list[Event]:
    events = _stream(run_id)
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    run = Run.objects.get(run_id=run_id)
    assert run.last_sequence == len(events)
    return events


# --- one run, many writers ------------------------------------------------------------------


@parallel_writers
def test_it_keeps_sequences_gap_free_with_parallel_appenders_steers_and_a_cancel():
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})
    child = methods.child_start(conn, start_params())
    cid = child["runId"]
    canonical = [{"kind": "text", "text": f"e{i}"} for i in range(1, 121)]
    appenders, steerers = 3, 3

    def work(i):
        rng = random.Random(i)
        if i < appenders:
            # Every appender emits the same runner stream, as reconnecting copies would:
            # overlaps are replays, and no appender can ever be ahead of what is stored.
            cursor, answers = 1, []
            while cursor <= len(canonical):
                size = rng.randint(1, 9)
                frame = canonical[cursor - 1 : cursor - 1 + size]
                answers.append(
                    methods.append_event_frame(
                        conn, {"runId": cid, "from": cursor, "events": frame}
                    )
                )
                cursor += len(frame)
            return answers
        if i < appenders + steerers:
            outcomes = []
            for k in range(25):
                params = on_child(child, message=f"steer {i}.{k}", requestId=f"s{i}-{k}")
                outcomes.append(methods.child_steer(conn, params)["outcome"])
            return outcomes
        time.sleep(0.05)
        return methods.child_cancel(conn, on_child(child))["runId"]

    results = in_threads(appenders + steerers + 1, work)
    assert all(r[0] == "ok" for r in results), results
    events = assert_gap_free(cid)
    runner_events = [e for e in events if e.runner_index is not None]
    assert [e.runner_index for e in runner_events] == list(range(1, 121))
    assert [e.text for e in runner_events] == [e["text"] for e in canonical]
    injected = sum(o == "injected" for r in results[appenders : appenders + steerers] for o in r[1])
    kinds = [e.kind for e in events]
    assert kinds.count("steer") == injected
    assert kinds.count("cancel-requested") == 1
    assert len(events) == 120 + injected + 1
    run = Run.objects.get(run_id=cid)
    assert run.emitted == 120
    # Every answer was a consistent view: emitted and sequence never go backwards per writer.
    for _, answers in results[:appenders]:
        emitted = [a["emitted"] for a in answers]
        sequence = [a["sequence"] for a in answers]
        assert emitted == sorted(emitted) and sequence == sorted(sequence)
        assert all(a["sequence"] <= len(events) for a in answers)
    # Steers and their receipts agree.
    assert SteerReceipt.objects.filter(outcome="injected").count() == injected
    assert Command.objects.filter(method="run.steer").count() == injected


@parallel_writers
def test_it_refuses_conflicting_parallel_frames_all_or_nothing():
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})

    def work(i):
        # Eight writers claim runner events 1..5 with different content: one wins.
        frame = [{"kind": "text", "text": f"w{i}-{k}"} for k in range(5)]
        return methods.append_event_frame(conn, {"runId": "root", "from": 1, "events": frame})

    results = in_threads(8, work)
    winners = [r for r in results if r[0] == "ok"]
    assert len(winners) == 1, results
    assert all(r == ("rpc", -32602) for r in results if r[0] != "ok"), results
    events = assert_gap_free("root")
    assert len(events) == 5
    assert len({e.text.split("-")[0] for e in events}) == 1


# --- one parent, many child.start -----------------------------------------------------------


@parallel_writers
def test_it_creates_exactly_one_child_for_simultaneous_identical_requests():
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})
    for round_ in range(5):
        params = start_params(request_id=f"same-{round_}")
        results = in_threads(8, lambda _i, p=params: methods.child_start(conn, p))
        assert all(r[0] == "ok" for r in results), results
        assert len({r[1]["runId"] for r in results}) == 1
        assert len({r[1]["conversationId"] for r in results}) == 1
    assert Run.objects.filter(parent__run_id="root").count() == 5
    assert Command.objects.filter(method="child.execute").count() == 5


@parallel_writers
def test_it_refuses_all_but_one_of_simultaneous_different_inputs_for_one_request_id():
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})
    results = in_threads(
        8, lambda i: methods.child_start(conn, start_params(request_id="same", message=f"m{i}"))
    )
    assert sum(r[0] == "ok" for r in results) == 1, results
    assert all(r == ("rpc", -32013) for r in results if r[0] != "ok"), results
    assert Run.objects.filter(parent__run_id="root").count() == 1


@parallel_writers
def test_it_holds_the_concurrency_cap_under_simultaneous_starts(settings):
    settings.DELEGATION_MAX_CONCURRENT = 4
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})
    results = in_threads(12, lambda i: methods.child_start(conn, start_params(request_id=f"r{i}")))
    assert sum(r[0] == "ok" for r in results) == 4, results
    assert all(r == ("rpc", -32011) for r in results if r[0] != "ok"), results
    assert Run.objects.filter(parent__run_id="root").count() == 4


@parallel_writers
def test_it_holds_the_64_children_cap_under_simultaneous_starts(settings):
    settings.DELEGATION_MAX_CONCURRENT = 1000
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})
    for i in range(60):
        methods.child_start(conn, start_params(request_id=f"pre{i}"))
    results = in_threads(10, lambda i: methods.child_start(conn, start_params(request_id=f"r{i}")))
    assert sum(r[0] == "ok" for r in results) == 4, results
    assert all(r == ("rpc", -32011) for r in results if r[0] != "ok"), results
    assert Run.objects.filter(parent__run_id="root").count() == 64


@parallel_writers
def test_it_creates_one_lease_for_simultaneous_first_starts():
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})
    results = in_threads(
        6, lambda i: methods.child_start(conn, start_params(request_id=f"r{i}", lease="L1"))
    )
    assert all(r[0] == "ok" for r in results), results
    assert Lease.objects.filter(lease_id="L1").count() == 1
    lease = Lease.objects.get(lease_id="L1")
    assert Run.objects.filter(lease=lease).count() == 6


@parallel_writers
def test_it_stores_one_receipt_for_simultaneous_identical_steers():
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})
    child = methods.child_start(conn, start_params())
    params = on_child(child, message="left", requestId="s-1")
    results = in_threads(8, lambda _i: methods.child_steer(conn, params))
    assert all(r == ("ok", {"outcome": "injected"}) for r in results), results
    assert SteerReceipt.objects.count() == 1
    assert [e.kind for e in _stream(child["runId"])] == ["steer"]
    assert Command.objects.filter(method="run.steer").count() == 1


@parallel_writers
def test_it_refuses_the_129th_receipt_under_simultaneous_steers():
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})
    child = methods.child_start(conn, start_params())
    for k in range(120):
        methods.child_steer(conn, on_child(child, message="m", requestId=f"pre{k}"))
    results = in_threads(
        12, lambda i: methods.child_steer(conn, on_child(child, message="m", requestId=f"s{i}"))
    )
    assert sum(r[0] == "ok" for r in results) == 8, results
    assert all(r == ("rpc", -32011) for r in results if r[0] != "ok"), results
    assert SteerReceipt.objects.count() == 128


@parallel_writers
def test_it_cancels_once_under_simultaneous_cancels():
    conn = service_connection()
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root"})
    child = methods.child_start(conn, start_params())
    results = in_threads(8, lambda _i: methods.child_cancel(conn, on_child(child)))
    assert all(r[0] == "ok" for r in results), results
    assert [e.kind for e in _stream(child["runId"])] == ["cancel-requested"]
    assert Command.objects.filter(method="run.cancel").count() == 1


@parallel_writers
def test_it_numbers_events_of_many_runs_of_one_runner_independently():
    conn = service_connection()
    for r in range(4):
        methods.open_run(conn, {"conversationId": f"conv-{r}", "runId": f"run-{r}"})

    def work(i):
        run_id = f"run-{i % 4}"
        for k in range(20):
            emitted = methods.append_event_frame(conn, {"runId": run_id, "from": 1, "events": []})[
                "emitted"
            ]
            frame = [{"kind": "text", "text": f"{i}-{k}"}]
            try:
                methods.append_event_frame(
                    conn, {"runId": run_id, "from": emitted + 1, "events": frame}
                )
            except RpcError as exc:
                assert exc.code == -32602  # lost a race for that index: refused whole
        return True

    results = in_threads(8, work)
    assert all(r[0] == "ok" for r in results), results
    for r in range(4):
        events = assert_gap_free(f"run-{r}")
        assert [e.runner_index for e in events] == list(range(1, len(events) + 1))


# --- through the socket, on every backend ---------------------------------------------------


async def test_it_interleaves_socket_appends_with_server_events_from_other_threads(runner):
    await runner.open("root-1")
    child = await runner.start()
    runner_pk = await adb(lambda: Run.objects.get(run_id="root-1").runner_id)()
    generation = await adb(lambda: Run.objects.get(run_id="root-1").runner.connection_generation)()
    conn = runners.Connection(runner_pk=runner_pk, generation=generation)
    outcomes: list[str] = []
    errors: list[str] = []

    def steer_in_another_thread():
        try:
            for k in range(30):
                params = on_child(child, "root-1", message=f"s{k}", requestId=f"s{k}")
                outcomes.append(methods.child_steer(conn, params)["outcome"])
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            connections.close_all()

    thread = threading.Thread(target=steer_in_another_thread, daemon=True)
    thread.start()
    cursor = 1
    for _ in range(30):
        frame = [{"kind": "text", "text": f"e{cursor}"}, {"kind": "text", "text": f"e{cursor + 1}"}]
        answer = await runner.emit(child["runId"], frame, start=cursor)
        assert answer["emitted"] == cursor + 1
        cursor += 2
    await adb(thread.join)(60)
    assert not errors, errors
    assert outcomes == ["injected"] * 30
    events = await adb(assert_gap_free)(child["runId"])
    assert len(events) == 90
    texts = [e.text for e in events if e.kind == "text"]
    assert texts == [f"e{i}" for i in range(1, 61)]
    steers = [e.text for e in events if e.kind == "steer"]
    assert steers == [f"s{k}" for k in range(30)]
    read = await runner.read(child, after=0)
    assert [e["sequence"] for e in read["events"]] == list(range(1, 91))

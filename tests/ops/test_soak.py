"""A soak that keeps issue 20's concurrency findings found (SPEC §6, §8, §10).

Two server processes, A and B, share the test database and a private Redis. Several runners
(the SDK) hold their sockets on A through one load-balancer address while they start children
and stream usage; operators cancel subtrees and set budgets below use through B's REST API;
budgets with ``maxCostUsd`` are crossed by the runners' own usage and budgets of
``maxSeconds: 1`` run out. Meanwhile PostgreSQL terminates the servers' backends, Redis stops
for a while and comes back, and A is killed with SIGKILL (the balancer sends the runners to B).

Then: no deadlock or internal error reached a runner (−32603 without the retryable flag, or a
retry of anything but a lost database connection) or an operator (a 5xx); no error frame with
``id: null``; every event a runner was told is stored is stored exactly once, gap-free; every
rollup equals a recount from the record; every budget stop was recorded; and every cancel
reached its runner within a second, Redis up or down, whether the runner's own socket queued
it (a budget crossed by its usage) or the other process did (an operator's cancel, a budget set
below use: while Redis fails, the runner's server polls its outbox four times a second instead
of every five). A cancel queued during the failover waits for the runners' reconnect.

Cancels through the other process used to take 1.1-5.3 s for a few of each run: every
socket's outbox claim and poll shared channels' one database thread per process with every
sync view, so a flush waited in that queue (delegation/runner_socket/database_calls.py, ``on_database``).

PostgreSQL + Redis only (.ci/run's second pass); bounded to a few minutes (``SOAK_SECONDS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from asgiref.sync import sync_to_async

from delegation.client import ClientError, RpcError, event
from delegation.models import Event, Run
from delegation.selectors import live_descendants
from tests.support import live_server
from tests.support.fault_tools import PgFaults
from tests.support.rollups import expected_rollups, stored_rollups
from tests.support.tcp_clients import RecordingRunner, api, assert_gap_free, make_runner

pytestmark = [
    pytest.mark.soak,
    pytest.mark.postgres(redis=True),
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_connections"),
    pytest.mark.timeout(900),
]

RUNNERS = 4
SECONDS = float(os.environ.get("SOAK_SECONDS", "60"))  # of churn; setup and checks add ~1 min
DELIVERY = 1.0  # seconds: a cancel must reach its runner within this, Redis up or down
# Except one queued while the runners fail over, which waits for their reconnect.
POLL = 5.0  # OUTBOX_RESEND_SECONDS, the servers' default
POLLED = POLL + DELIVERY
BY_OTHER_PROCESS = ("operator cancel", "budget set below use")  # through B's REST API
FRAME = 10  # events a frame, every tenth a usage event
COST = 0.05  # USD of one usage event
CROSSED_AT = 0.5  # USD: the maxCostUsd the runners' own usage crosses (ten frames)
# Refusals a runner meets in ordinary churn: a parent already stopping (−32014), a budget used
# up (−32017), caps (−32011), depth (−32010). Anything else is a finding.
EXPECTED_REFUSALS = {-32010, -32011, -32014, -32017}
# What a terminated backend is answered with: retryable, changed nothing.
LOST_DATABASE = "database unavailable"


@dataclass
class Ledger:
    """What the workloads saw, for the checks at the end."""

    started: float = field(default_factory=time.monotonic)
    streams: list = field(default_factory=list)  # every RunStream the runners wrote
    refusals: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # unexpected errors, with context
    # (root runId, monotonic time the stop was answered, how it was stopped)
    stops: list[tuple[str, float, str]] = field(default_factory=list)
    timed_roots: list[str] = field(default_factory=list)  # maxSeconds: 1
    crossed_roots: list[str] = field(default_factory=list)  # maxCostUsd crossed by usage
    open_targets: dict[str, float] = field(default_factory=dict)  # operators' picks
    redis_down: list[tuple[float, float]] = field(default_factory=list)
    failover: list[tuple[float, float]] = field(default_factory=list)

    def during(self, windows, at: float) -> bool:
        return any(start <= at < end for start, end in windows)


class ClientLog(logging.Handler):
    """The SDK's warnings: an error frame without an id, and every call it retried."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.null_id: list[str] = []
        self.retried: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("server error"):
            self.null_id.append(message)
        elif "retrying in" in message:
            self.retried.append(message)


def usage_frame(tag: str, start: int) -> list[dict]:
    usage = {"inputTokens": 120, "outputTokens": 30, "costUsd": COST, "model": "soak"}
    return [
        event("usage", "tokens", input=usage)
        if i % FRAME == FRAME - 1
        else event("text", f"{tag} {start + i}")
        for i in range(FRAME)
    ]


async def guarded(ledger: Ledger, what: str, call):
    """What the ``call`` (a coroutine) returns; an expected refusal or a finished stream gives
    None, anything else is noted as a failure."""
    try:
        return await call
    except RpcError as exc:
        if exc.code in EXPECTED_REFUSALS:
            ledger.refusals[exc.code] += 1
            return None
        ledger.failures.append(f"{what}: {exc.code} {exc.message} {exc.data}")
    except ClientError as exc:
        if "finished" in str(exc):
            return None  # the run was cancelled and finished under the workload
        ledger.failures.append(f"{what}: {exc!r}")
    return None


async def stream_work(runner, index: int, ledger: Ledger, stop: asyncio.Event):
    """A tree nobody stops: its events are counted exactly, frame by frame."""
    client = runner.client
    root = f"s{index}"
    await client.open_run(f"c-{root}", root)
    runs = [root]
    for n in range(2):
        child = await client.child_start(
            root, "ext", 1, {"requestId": f"{root}-{n}", "profile": "worker", "message": "go"}
        )
        runs.append(child.run_id)
    streams = [client.stream(run_id) for run_id in runs]
    ledger.streams.extend(streams)
    for frame in itertools.count():
        if stop.is_set():
            return runs
        stream = streams[frame % len(streams)]
        await guarded(ledger, f"run.event {stream.run_id}", stream.emit(*usage_frame("s", frame)))
        await asyncio.sleep(0.02)


async def churn_work(runner, index: int, ledger: Ledger, stop: asyncio.Event):
    """Trees grown child by child until something stops them: a crossed budget, a budget's
    time, or an operator through B; a tree nobody stops is finished after a few seconds."""
    client = runner.client
    for tree in itertools.count():
        if stop.is_set():
            return
        root = f"t{index}-{tree}"
        kind = ("crossed", "timed", "operator")[tree % 3]
        budget = {"crossed": {"maxCostUsd": CROSSED_AT}, "timed": {"maxSeconds": 1}}.get(kind)
        await client.open_run(f"c-{root}", root, budget=budget)
        if kind == "timed":
            ledger.timed_roots.append(root)
        elif kind == "operator":
            ledger.open_targets[root] = time.monotonic()
        # Long enough for the operators to pick it: they act within a second or two.
        # and a timed tree long enough for the upkeep to stop it after its second.
        patience = {"operator": 15, "timed": 1 + POLLED}.get(kind, 4)
        live, cost, deadline = [root], 0.0, time.monotonic() + patience
        # A timed tree stays open until its second is up, even past the end of the churn.
        while (kind == "timed" or not stop.is_set()) and time.monotonic() < deadline:
            if runner.received("run.cancel", runId=root):
                break
            parent = random.choice(live)
            if len(live) < 7:
                request = {"requestId": f"{root}-{len(live)}", "profile": "worker", "message": "go"}
                child = await guarded(
                    ledger,
                    f"child.start under {parent}",
                    client.child_start(parent, "ext", 1, request),
                )
                if child is not None:
                    live.append(child.run_id)
            stream = client.stream(random.choice(live))
            if stream not in ledger.streams:
                ledger.streams.append(stream)
            acked = await guarded(
                ledger, f"run.event {stream.run_id}", stream.emit(*usage_frame(root, 0))
            )
            if acked is not None:
                cost += COST
                if (
                    kind == "crossed"
                    and round(cost, 9) >= CROSSED_AT
                    and root not in ledger.crossed_roots
                ):
                    ledger.crossed_roots.append(root)
                    ledger.stops.append((root, time.monotonic(), "budget crossed"))
            await asyncio.sleep(0.05)
        ledger.open_targets.pop(root, None)
        if root in ledger.crossed_roots:
            # Crossed: the stop is on its way (its delivery is checked at the end); a runner
            # that ended the tree first would leave nothing to stop.
            with contextlib.suppress(AssertionError):
                await runner.wait_command("run.cancel", POLLED, runId=root)
        # What nothing stopped, the runner ends itself, leaves first.
        for run_id in reversed(live):
            if not runner.received("run.cancel", runId=run_id):
                await guarded(ledger, f"run.finish {run_id}", client.finish(run_id))


async def operator_work(b, token: str, ledger: Ledger, stop: asyncio.Event, rest: Counter):
    """Cancels and budgets below use, through the process the runners are not on."""
    for turn in itertools.count():
        if stop.is_set():
            return
        await asyncio.sleep(0.3)
        ready = [r for r, at in list(ledger.open_targets.items()) if time.monotonic() - at > 0.5]
        if not ready:
            continue
        root = random.choice(ready)
        ledger.open_targets.pop(root, None)
        if turn % 2:
            how, method, path = "operator cancel", "POST", f"/api/runs/{root}/cancel"
            body = {"reason": "soak", "cascade": True}
        else:
            how, method, path = "budget set below use", "PUT", f"/api/runs/{root}/budget"
            body = {"maxCostUsd": 0.01, "reason": "soak"}
        status, answer = await asyncio.to_thread(api, b.http_url, method, path, token, body)
        rest[status] += 1
        if status >= 500:
            ledger.failures.append(f"{method} {path}: {status} {answer}")
        elif status == 200:
            ledger.stops.append((root, time.monotonic(), how))


async def fault_work(servers, faults, redis, balancer, ledger: Ledger, stop: asyncio.Event):
    """Backends terminated three times, Redis down for a fifth of the soak, then A killed."""
    a, b = servers
    step = SECONDS / 8

    async def at(fraction: float):
        await asyncio.sleep(max(0.0, ledger.started + fraction * SECONDS - time.monotonic()))

    await at(1 / 8)
    await asyncio.to_thread(faults["a"].terminate_server_backends)
    await at(2 / 8)
    await asyncio.to_thread(faults["b"].terminate_server_backends)
    await at(3 / 8)
    down = time.monotonic()
    await asyncio.to_thread(redis.stop, True)
    await asyncio.sleep(step / 2)
    await asyncio.to_thread(faults["a"].terminate_server_backends)
    await asyncio.sleep(step)
    await asyncio.to_thread(redis.start)
    # A Redis restart forgets group memberships: a socket joins again on its next outbox
    # poll, so until then a doorbell from the other process can still miss it.
    ledger.redis_down.append((down, time.monotonic() + POLL + DELIVERY))
    await at(6 / 8)
    killed = time.monotonic()
    balancer.switch(b.port)
    await asyncio.to_thread(a.stop, True)  # SIGKILL: frames in flight are lost
    # The runners' reconnect (SDK backoff) is the failover window, not a delivery.
    ledger.failover.append((killed, killed + 3))


def figures(report: dict) -> dict:
    """(phase, how) → (stops, median and worst seconds to the runner)."""
    out = {}
    for key, seconds in sorted(report.items()):
        known = sorted(s for s in seconds if s is not None)
        worst = known[-1] if known else None
        median = known[len(known) // 2] if known else None
        out[key] = (len(seconds), median and round(median, 3), worst and round(worst, 3))
    return out


def windows(spans, ledger: Ledger) -> list[tuple[float, float]]:
    return [(round(a - ledger.started, 1), round(b - ledger.started, 1)) for a, b in spans]


def deliveries(runners: dict, ledger: Ledger):
    """(root, how, when answered, seconds from the stop's answer to its run.cancel at the
    runner, or None if it never came)."""
    for root, answered, how in ledger.stops:
        runner = runners[int(root[1:].split("-")[0])]
        arrived = [at for at, _ in runner.received("run.cancel", runId=root)]
        yield root, how, answered, (min(arrived) - answered if arrived else None)


def cancel_requested(roots: list[str]) -> set[str]:
    return set(
        Run.objects.filter(run_id__in=roots, cancel_requested_at__isnull=False).values_list(
            "run_id", flat=True
        )
    )


def record_problems(streams) -> list[str]:
    """Every event a runner was told is stored is stored once, in order, and nothing else."""
    problems = []
    for stream in streams:
        events = list(
            Event.objects.filter(run__run_id=stream.run_id)
            .order_by("sequence")
            .values("sequence", "runner_index")
        )
        try:
            assert_gap_free(events, stream.run_id)
        except AssertionError as exc:
            problems.append(str(exc)[:300])
        indexes = [e["runner_index"] for e in events if e["runner_index"] is not None]
        if indexes != list(range(1, stream.emitted + 1)):
            problems.append(
                f"{stream.run_id}: runner indexes stored {indexes[:5]}..{indexes[-5:]} "
                f"({len(indexes)}), the runner was told {stream.emitted}"
            )
    return problems


def budget_problems(ledger: Ledger) -> list[str]:
    problems = []
    for root in ledger.timed_roots + ledger.crossed_roots:
        run = Run.objects.get(run_id=root)
        if not Event.objects.filter(run=run, kind="budget-exceeded").exists():
            problems.append(f"{root}: no budget-exceeded recorded")
        live = [r.run_id for r in [run, *live_descendants(run)] if r.status == "running"]
        if live:
            problems.append(f"{root}: {len(live)} run(s) of the stopped tree still running")
    return problems


async def test_it_surfaces_no_deadlock_loses_nothing_and_delivers_every_cancel_in_a_second(
    daphne_factory, private_redis, proxies, operator_token
):
    url = live_server.database_url()
    names = {"a": "canopy-soak-a", "b": "canopy-soak-b"}
    env = {"REDIS_URL": private_redis.url, "MAINTENANCE_INTERVAL_SECONDS": "0.5"}
    servers = [
        daphne_factory(
            DATABASE_URL=url + ("&" if "?" in url else "?") + f"application_name={names[k]}",
            **env,
        )
        for k in ("a", "b")
    ]
    a, b = servers
    faults = {k: await asyncio.to_thread(PgFaults, name) for k, name in names.items()}
    balancer = proxies(a.port)  # one address in front of both, as a load balancer would be
    tokens = [await sync_to_async(make_runner)(f"soak-{i}") for i in range(RUNNERS)]
    log = ClientLog()
    logging.getLogger("canopy.client").addHandler(log)
    ledger, stop, rest = Ledger(), asyncio.Event(), Counter()
    runners = {i: RecordingRunner(balancer.ws_url(), tokens[i]) for i in range(RUNNERS)}
    try:
        for runner in runners.values():
            await runner.__aenter__()
        ledger.started = time.monotonic()
        tasks = [
            *(asyncio.create_task(stream_work(r, i, ledger, stop)) for i, r in runners.items()),
            *(asyncio.create_task(churn_work(r, i, ledger, stop)) for i, r in runners.items()),
            asyncio.create_task(operator_work(b, operator_token, ledger, stop, rest)),
            asyncio.create_task(operator_work(b, operator_token, ledger, stop, rest)),
        ]
        faulting = asyncio.create_task(
            fault_work(servers, faults, private_redis, balancer, ledger, stop)
        )
        async with asyncio.timeout(SECONDS + 120):
            await faulting
            await asyncio.sleep(max(0.0, ledger.started + SECONDS - time.monotonic()))
            stop.set()
            done = await asyncio.gather(*tasks, return_exceptions=True)
        crashed = [repr(d) for d in done if isinstance(d, BaseException)]
        streams = [s for s in done[:RUNNERS] if isinstance(s, list)]
        # Drain: the stream trees end; every command the servers queued gets its answer.
        for index, runs in enumerate(streams):
            for run_id in reversed(runs):
                finish = runners[index].client.finish(run_id, output="done")
                await guarded(ledger, f"finish {run_id}", finish)
        await asyncio.sleep(3)
    finally:
        for runner in runners.values():
            await runner.__aexit__(None)
        logging.getLogger("canopy.client").removeHandler(log)
        for f in faults.values():
            await asyncio.to_thread(f.close)

    record = await sync_to_async(record_problems)(ledger.streams)
    budgets = await sync_to_async(budget_problems)(ledger)
    stored, expected = (
        await sync_to_async(stored_rollups)(),
        await sync_to_async(expected_rollups)(),
    )
    rollup_diffs = [pk for pk in expected if stored.get(pk) != expected[pk]]
    requested = await sync_to_async(cancel_requested)([root for root, _, _ in ledger.stops])
    late, report, timeline = [], {}, []
    for root, how, answered, seconds in deliveries(runners, ledger):
        if root not in requested:
            continue  # the runner had ended the tree first: nothing left to cancel
        phase = (
            "failover"
            if ledger.during(ledger.failover, answered)
            else "redis down"
            if ledger.during(ledger.redis_down, answered)
            else "redis up"
        )
        report.setdefault((phase, how), []).append(seconds)
        timeline.append((round(answered - ledger.started, 1), how, seconds and round(seconds, 3)))
        bound = POLLED if phase == "failover" else DELIVERY
        if seconds is None or seconds > bound:
            at = round(answered - ledger.started, 1)
            late.append((phase, how, root, at, None if seconds is None else round(seconds, 3)))
    retried = [m for m in log.retried if LOST_DATABASE not in m]
    print(
        f"soak: {len(ledger.streams)} streams, {sum(s.emitted for s in ledger.streams)} events, "
        f"stops {figures(report)}, refusals {dict(ledger.refusals)}, REST {dict(rest)}, "
        f"SDK retries {len(log.retried)}; Redis down {windows(ledger.redis_down, ledger)}, "
        f"failover {windows(ledger.failover, ledger)} (s from the start)"
    )
    if os.environ.get("SOAK_VERBOSE"):
        print("soak timeline (s from the start, how, s to the runner):", sorted(timeline))
    # Every finding at once: a soak run is too dear to learn them one per run.
    findings = {
        "workload crashed": crashed,
        "errors surfaced to a runner or an operator": ledger.failures,
        "error frames with id: null": log.null_id,
        "calls the SDK retried for anything but a lost database": retried,
        "events lost, duplicated or out of order": record,
        "budget stops not recorded or not stopping their tree": budgets,
        "rollups that differ from a recount": rollup_diffs,
        "cancels late (> 1 s, or after a failover the reconnect's bound) or never delivered": sorted(
            late, key=lambda x: -(x[4] or 99)
        ),
    }
    findings = {what: found for what, found in findings.items() if found}
    assert not findings, "\n".join(
        f"{what}: {len(found)}, e.g. {found[:5]}" for what, found in findings.items()
    )
    needed = {("redis up", "budget crossed"), ("redis down", "budget crossed")}
    needed |= {(phase, how) for phase in ("redis up", "redis down") for how in BY_OTHER_PROCESS}
    assert needed <= set(report), f"the soak did not exercise {needed - set(report)}"

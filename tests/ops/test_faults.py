"""Faults, each on real processes and sockets (issue 6): what breaks, and what must not.

- a server process killed with SIGKILL mid-stream: the runner fails over to the other process
  (PostgreSQL + Redis), or comes back to the restarted one (any backend); nothing is lost or
  stored twice, and a live client that reconnects with its last sequence misses nothing;
- Redis restarted (a private ``redis-server`` on a spare port, never the machine's);
- a PostgreSQL connection dropped under a request (``pg_terminate_backend`` on the server's
  own backends, found by their ``application_name``; never a restart of the machine's server);
- a runner process killed without goodbye, and a runner whose server died and never returned;
- a lease expiring while its runner is away;
- a live client that stops reading its socket.

Every wait is bounded; every process, proxy and socket a test starts is stopped by a fixture.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from delegation.client import event
from delegation.models import AuditEntry, Lease, Run, Runner
from delegation.services.run_actions import Actor, do_steer_run
from tests.support import live_server
from tests.support.fault_tools import DOOMED_RUNNER, PgFaults, RedisServer, rss_mb
from tests.support.paths import PROJECT as BASE_DIR
from tests.support.tcp_clients import (
    LiveClient,
    RawWebSocket,
    RecordingRunner,
    api,
    assert_gap_free,
    eventually,
    make_runner,
    run_row,
    stored_events,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_connections"),
]

ENGINE = settings.DATABASES["default"]["ENGINE"]
ON_POSTGRES = ENGINE == "django.db.backends.postgresql"
SCALE_OUT = ON_POSTGRES and bool(settings.REDIS_URL)
# A second server process needs PostgreSQL and Redis.
needs_scale_out = pytest.mark.postgres(redis=True)
# pg_terminate_backend.
needs_postgres = pytest.mark.postgres
needs_redis_server = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="no redis-server binary to run a private Redis"
)
PROMPT = 5.0  # seconds for anything that should be immediate, with slack for a loaded machine


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def processes():
    """Popen a helper process; every one is killed at the end of the test."""
    started: list[subprocess.Popen] = []

    def popen(args, **kw) -> subprocess.Popen:
        process = subprocess.Popen(args, start_new_session=True, **kw)
        started.append(process)
        return process

    yield popen
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def live_url(server) -> str:
    return f"ws://127.0.0.1:{server.port}/ws/live/"


async def setup_people(runner_name: str, operator_token: str) -> tuple[str, str]:
    """(runner token, operator API token)"""
    token = await sync_to_async(make_runner)(runner_name)
    return token, operator_token


class Producer:
    """Emits ``total`` numbered text events on one run, one per call, in the background."""

    def __init__(self, client, run_id: str, total: int, pace: float = 0.003):
        self.stream = client.stream(run_id)
        self.total = total
        self.pace = pace
        self.done = 0
        self.progress = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self):
        for i in range(self.total):
            await self.stream.emit(event("text", f"event {i}"))
            self.done = i + 1
            self.progress.set()
            await asyncio.sleep(self.pace)

    async def reach(self, count: int, timeout: float = 30):
        """Wait until ``count`` events are stored; fails with the producer's own error."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.done < count:
            if self.task.done():
                self.task.result()
            remaining = deadline - loop.time()
            assert remaining > 0, f"the producer stopped at {self.done} of {count}"
            self.progress.clear()
            waiter = asyncio.ensure_future(self.progress.wait())
            await asyncio.wait(
                [waiter, self.task], timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()

    async def finish(self, timeout: float = 60):
        async with asyncio.timeout(timeout):
            await self.task


def runner_texts(events: list[dict]) -> list[str]:
    return [e["text"] for e in events if e["runner_index"] is not None]


def assert_exactly_once_in_order(events: list[dict], total: int, what: str):
    assert_gap_free(events, what)
    assert runner_texts(events) == [f"event {i}" for i in range(total)], what
    indexes = [e["runner_index"] for e in events if e["runner_index"] is not None]
    assert indexes == list(range(1, total + 1)), what


async def assert_live_matches(live: LiveClient, run_id: str, events: list[dict], timeout=PROMPT):
    head = events[-1]["sequence"]
    await live.wait_until(
        lambda: live.last_sequence(run_id) >= head, timeout, f"{run_id} up to {head}"
    )
    seen = [(e["sequence"], e["kind"], e.get("text")) for e in live.events(run_id)]
    assert seen == [(e["sequence"], e["kind"], e["text"]) for e in events], (
        f"the live stream of {run_id} differs from the record (gap, duplicate or order)"
    )


# --- (a) a server process killed mid-stream ------------------------------------------------------


@needs_scale_out
async def test_it_fails_over_to_the_other_process_when_one_is_killed_mid_stream(
    daphne_factory, proxies, live_clients, operator_token
):
    env = {"LIVE_HEARTBEAT_SECONDS": 60, "OUTBOX_RESEND_SECONDS": 60}
    a, b = daphne_factory(**env), daphne_factory(**env)
    balancer = proxies(a.port)  # one address in front of both, as a load balancer would be
    token, operator = await setup_people("failover-runner", operator_token)
    total = 300

    async with RecordingRunner(balancer.ws_url(), token) as runner:
        await runner.client.open_run("conv-failover", "failover-run")
        watcher = await live_clients(live_url(b), operator)
        await watcher.subscribe("failover-run")
        producer = Producer(runner.client, "failover-run", total)
        await producer.reach(100)
        await asyncio.to_thread(a.stop, True)  # SIGKILL: no close frames, frames in flight lost
        balancer.switch(b.port)
        await producer.finish()
        assert runner.client.connections == 2, "the runner should have re-registered once, on B"

        # Commands now reach the runner on B, the process holding its connection.
        status, answer = await asyncio.to_thread(
            api,
            b.http_url,
            "POST",
            "/api/runs/failover-run/steer",
            operator,
            {"requestId": "after-failover", "message": "still there?"},
        )
        assert (status, answer) == (200, {"outcome": "injected"})
        sent = time.monotonic()
        arrived = await runner.wait_command("run.steer", PROMPT, requestId="after-failover")
        assert arrived - sent < PROMPT
        await runner.client.finish("failover-run", output="done")

    events = await sync_to_async(stored_events)("failover-run")
    assert [e["kind"] for e in events if e["runner_index"] is None] == ["steer"]
    assert_exactly_once_in_order(events, total, "failover-run")
    row = await sync_to_async(run_row)("failover-run")
    assert (row["status"], row["emitted"]) == ("succeeded", total)
    # B's watcher never lost its socket, and saw the record exactly once, in order.
    await assert_live_matches(watcher, "failover-run", events)
    assert watcher.close_codes == []


async def test_it_loses_nothing_when_its_only_process_is_killed_and_restarted_on_the_same_port(
    daphne_factory, live_clients, operator_token
):
    server = daphne_factory(LIVE_HEARTBEAT_SECONDS=1)
    token, operator = await setup_people("restart-runner", operator_token)
    total = 240

    async with RecordingRunner(server.ws_url, token) as runner:
        await runner.client.open_run("conv-restart", "restart-run")
        watcher = await live_clients(live_url(server), operator, reconnect=True)
        await watcher.subscribe("restart-run")
        producer = Producer(runner.client, "restart-run", total)
        await producer.reach(80)
        await asyncio.to_thread(server.stop, True)
        # While no process runs, an operator steers (through the database, as the admin or a
        # CLI would): the command waits in the outbox for the runner's next registration.
        run = await sync_to_async(Run.objects.get)(run_id="restart-run")
        answer = await sync_to_async(do_steer_run)(
            Actor.system("test-operator"), run, request_id="while-down", message="hi"
        )
        assert answer == {"outcome": "injected"}
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.start)
        restarted = time.monotonic()
        arrived = await runner.wait_command("run.steer", 15, requestId="while-down")
        assert arrived - restarted < 15
        await producer.finish()
        await runner.client.finish("restart-run", output="done")
        assert runner.client.connections == 2

    events = await sync_to_async(stored_events)("restart-run")
    assert [e["kind"] for e in events if e["runner_index"] is None] == ["steer"]
    assert_exactly_once_in_order(events, total, "restart-run")
    # The watcher lost its socket with the process, came back with its last sequence and
    # holds the record exactly once, in order.
    await assert_live_matches(watcher, "restart-run", events, timeout=10)
    assert watcher.reconnects >= 1


# --- (b) Redis restarted ---------------------------------------------------------------------------


def redis_servers(daphne_factory, redis: RedisServer, **env):
    """(runner's server, watcher's server): two processes when they can share the database."""
    env = {"REDIS_URL": redis.url, "LIVE_HEARTBEAT_SECONDS": 1, "OUTBOX_RESEND_SECONDS": 1, **env}
    a = daphne_factory(**env)
    return (a, daphne_factory(**env)) if ON_POSTGRES else (a, a)


@needs_redis_server
async def test_it_loses_nothing_when_redis_restarts_mid_stream(
    daphne_factory, private_redis, live_clients, operator_token
):
    a, b = redis_servers(daphne_factory, private_redis)
    token, operator = await setup_people("redis-runner", operator_token)
    total = 200

    async with RecordingRunner(a.ws_url, token) as runner:
        await runner.client.open_run("conv-redis", "redis-run")
        # A client as the live protocol describes it: on a dead socket it reconnects with
        # its last sequence.
        watcher = await live_clients(live_url(b), operator, reconnect=True)
        await watcher.subscribe("redis-run")
        producer = Producer(runner.client, "redis-run", total, pace=0.01)
        await producer.reach(60)
        await asyncio.to_thread(private_redis.stop, True)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(private_redis.start)
        await producer.finish()
        # After the restart a command still reaches the runner (doorbell or outbox poll).
        run = await sync_to_async(Run.objects.get)(run_id="redis-run")
        await sync_to_async(do_steer_run)(
            Actor.system("test-operator"), run, request_id="after-redis", message="hi"
        )
        await runner.wait_command("run.steer", PROMPT, requestId="after-redis")
        await runner.client.finish("redis-run", output="done")

    events = await sync_to_async(stored_events)("redis-run")
    assert_exactly_once_in_order(events, total, "redis-run")
    await assert_live_matches(watcher, "redis-run", events, timeout=10)


@needs_redis_server
async def test_it_keeps_serving_runners_and_live_sockets_from_the_database_while_redis_is_down(
    daphne_factory, private_redis, live_clients, operator_token
):
    """SPEC §8: the database is the record, the channel layer only rings the doorbell. While
    Redis is down a runner still stores its events and an open live socket still gets them
    (its heartbeat catch-up reads the database); only promptness may suffer."""
    a, b = redis_servers(daphne_factory, private_redis)
    token, operator = await setup_people("outage-runner", operator_token)

    async with RecordingRunner(a.ws_url, token) as runner:
        await runner.client.open_run("conv-outage", "outage-run")
        stream = runner.client.stream("outage-run")
        watcher = await live_clients(live_url(b), operator)
        await watcher.subscribe("outage-run")
        await stream.emit(*[event("text", f"event {i}") for i in range(5)])
        await watcher.wait_until(lambda: watcher.last_sequence("outage-run") == 5, PROMPT, "5")

        await asyncio.to_thread(private_redis.stop, True)
        problems = []
        try:
            try:
                await stream.emit(*[event("text", f"event {i}") for i in range(5, 10)], timeout=4)
            except Exception as exc:
                problems.append(f"run.event while Redis was down: {exc!r}")
            try:
                await watcher.wait_until(
                    lambda: watcher.last_sequence("outage-run") >= 10, 4, "events while down"
                )
            except AssertionError:
                problems.append(
                    "the live socket did not get the events stored while Redis was down: "
                    f"last sequence {watcher.last_sequence('outage-run')}, socket closed with "
                    f"{watcher.closed_code if watcher.closed.is_set() else 'nothing (open)'}"
                )
        finally:
            await asyncio.to_thread(private_redis.start)
        await stream.flush(timeout=30)
        await runner.client.finish("outage-run", output="done")
        connections = runner.client.connections

    assert not problems, "\n".join(
        problems + [f"(the runner registered {connections} time(s) in all)"]
    )
    events = await sync_to_async(stored_events)("outage-run")
    assert_exactly_once_in_order(events, 10, "outage-run")


@needs_redis_server
async def test_it_lets_a_runner_register_once_redis_takes_writes_again(
    daphne_factory, private_redis
):
    """Redis refusing writes for a moment (out of memory) while a runner connects: the
    registration fails, and the runner gets in once Redis recovers; it is not shut out."""
    server = daphne_factory(REDIS_URL=private_redis.url)
    token = await sync_to_async(make_runner)("oom-runner")
    await asyncio.to_thread(private_redis.config_set, "maxmemory", "1")  # every write refused
    runner = RecordingRunner(server.ws_url, token)
    try:
        connecting = asyncio.create_task(runner.client.connect(timeout=20))
        await asyncio.sleep(1.5)
        await asyncio.to_thread(private_redis.config_set, "maxmemory", "0")
        try:
            await asyncio.wait_for(connecting, 10)
        except Exception as exc:
            raise AssertionError(
                f"the runner never registered after Redis took writes again: {exc!r} (the "
                "server answered runner.register with an internal error while Redis refused "
                "group_add, and the SDK treats a refused registration as final)"
            ) from None
        await runner.client.open_run("conv-oom", "oom-run")
        await runner.client.emit("oom-run", event("text", "in"))
    finally:
        await runner.client.close()
    assert [e["text"] for e in await sync_to_async(stored_events)("oom-run")] == ["in"]


# --- (c) a PostgreSQL connection dropped -----------------------------------------------------------


@needs_postgres
async def test_it_retries_a_request_cut_off_from_postgresql_and_serves_the_next(
    daphne_factory, live_clients, operator_token
):
    name = "canopy-fault-server"
    url = live_server.database_url()
    server = daphne_factory(
        DATABASE_URL=url + ("&" if "?" in url else "?") + f"application_name={name}",
        LIVE_HEARTBEAT_SECONDS=1,
        CONN_MAX_AGE=60,  # persistent connections, the kind that go stale
    )
    token, operator = await setup_people("pg-runner", operator_token)
    faults = await asyncio.to_thread(PgFaults, name)
    try:
        async with RecordingRunner(server.ws_url, token) as runner:
            c = runner.client
            await c.open_run("conv-pg", "pg-run")
            stream = c.stream("pg-run")
            await stream.emit(event("text", "event 0"))
            watcher = await live_clients(live_url(server), operator)
            await watcher.subscribe("pg-run")

            # A REST steer held in flight on a row lock, when its connection is killed.
            await asyncio.to_thread(faults.lock_run, "pg-run")
            body = {"requestId": "pg-steer", "message": "hold on"}
            request = asyncio.create_task(
                asyncio.to_thread(
                    api, server.http_url, "POST", "/api/runs/pg-run/steer", operator, body, 20
                )
            )
            await eventually(faults.waiting_on_lock, PROMPT, "the steer waiting on the row lock")
            killed = await asyncio.to_thread(faults.terminate_server_backends)
            assert killed >= 1
            # An operator's steer is idempotent by requestId: the service tries it once more
            # on a fresh connection (which waits on the lock again) instead of answering 500.
            await eventually(faults.waiting_on_lock, PROMPT, "the retried steer on the row lock")
            await asyncio.to_thread(faults.unlock)
            cut = time.monotonic()
            status, answer = await request
            assert time.monotonic() - cut < PROMPT, "the retried request hung"
            assert (status, answer) == (200, {"outcome": "injected"}), answer
            # The next request gets a fresh connection; the retry stored one steer, not two.
            status, again = await asyncio.to_thread(
                api, server.http_url, "POST", "/api/runs/pg-run/steer", operator, body
            )
            assert (status, again) == (200, answer), again
            await runner.wait_command("run.steer", PROMPT, requestId="pg-steer")

            # A run.event held in flight the same way: an error answer, then a clean resend.
            await asyncio.to_thread(faults.lock_run, "pg-run")
            emit = asyncio.create_task(stream.emit(event("text", "event 1"), timeout=20))
            await eventually(faults.waiting_on_lock, PROMPT, "run.event waiting on the row lock")
            await asyncio.to_thread(faults.terminate_server_backends)
            # run.event is idempotent by `from`: the server tries it once more on a fresh
            # connection (which waits on the lock again) and the SDK resends what the server
            # marks retryable, so the emit goes through once the lock is released.
            await eventually(faults.waiting_on_lock, PROMPT, "the retried run.event on the lock")
            await asyncio.to_thread(faults.unlock)
            cut = time.monotonic()
            ack = await emit
            assert time.monotonic() - cut < PROMPT, "the retried run.event hung"
            assert ack.emitted == 2
            await stream.emit(event("text", "event 2"))

            # The live socket's reads went through killed connections too; it still delivers.
            events = await sync_to_async(stored_events)("pg-run")
            await assert_live_matches(watcher, "pg-run", events)
            await c.finish("pg-run", output="done")
    finally:
        await asyncio.to_thread(faults.close)

    events = await sync_to_async(stored_events)("pg-run")
    assert_gap_free(events, "pg-run")
    assert [(e["kind"], e["text"]) for e in events] == [
        ("text", "event 0"),
        ("steer", "hold on"),
        ("text", "event 1"),
        ("text", "event 2"),
    ]
    receipts = await sync_to_async(
        lambda: list(AuditEntry.objects.filter(action="steer").values_list("outcome", flat=True))
    )()
    assert receipts == ["injected"]


# --- (d) a runner killed -----------------------------------------------------------------------------


GRACE = 2.0


async def test_it_marks_a_killed_runners_runs_lost_after_the_grace_period_and_revokes_its_leases(
    daphne_factory, processes
):
    server = daphne_factory(RUNNER_GRACE_SECONDS=GRACE, MAINTENANCE_INTERVAL_SECONDS=0.2)
    token = await sync_to_async(make_runner)("doomed-runner")
    env = {**os.environ, "PYTHONPATH": str(BASE_DIR)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("PANDO_DELEGATION_DEPTH", None)
    runner = processes(
        [sys.executable, "-c", DOOMED_RUNNER, server.ws_url, token],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = await asyncio.wait_for(asyncio.to_thread(runner.stdout.readline), 30)
    assert line.startswith("READY"), line + (runner.stdout.read() if runner.poll() else "")
    leased_run, foreground_run = line.split()[1:3]
    all_runs = ["doomed-root", leased_run, foreground_run]

    runner.send_signal(signal.SIGKILL)  # no close frame, no goodbye
    await asyncio.wait_for(asyncio.to_thread(runner.wait), 10)
    await eventually(
        lambda: not Runner.objects.get(name="doomed-runner").connected,
        PROMPT,
        "the server noticing the dead runner",
    )
    # Inside the grace period nothing is decided yet: the runner may still come back.
    rows = await sync_to_async(lambda: [run_row(r) for r in all_runs])()
    assert [r["status"] for r in rows] == ["running"] * 3

    await eventually(
        lambda: all(run_row(r)["status"] == "lost" for r in all_runs),
        GRACE + PROMPT,
        "the runs marked lost",
    )
    for run_id in all_runs:
        row = await sync_to_async(run_row)(run_id)
        assert (row["done"], row["error"], row["cancelled"]) == (True, "runner lost", False)
    lost = await sync_to_async(Runner.objects.get)(name="doomed-runner")
    assert lost.lost_at is not None
    assert (lost.lost_at - lost.disconnected_at).total_seconds() >= GRACE - 0.05
    lease = await sync_to_async(Lease.objects.get)(lease_id="doomed-lease")
    assert (lease.state, lease.ended_at is not None) == ("revoked", True)
    root_events = await sync_to_async(stored_events)("doomed-root")
    released = [e for e in root_events if e["kind"] == "lease-released"]
    assert len(released) == 1 and released[0]["data"] == {
        "leaseId": "doomed-lease",
        "state": "revoked",
    }
    assert_gap_free(root_events, "doomed-root")
    audit = await sync_to_async(
        lambda: list(AuditEntry.objects.filter(action="runner-lost").values_list("target_id"))
    )()
    assert audit == [("doomed-runner",)]


async def test_it_marks_runs_lost_when_their_server_process_died_and_the_runner_never_returned(
    daphne_factory, proxies
):
    """SPEC §5 runner loss, when what vanished is the server process holding the socket: no
    process ever saw that socket close, yet the runner is gone all the same: its socket stops
    touching last_seen_at, and after RUNNER_SILENT_SECONDS it counts as closed."""
    server = daphne_factory(
        RUNNER_GRACE_SECONDS=1,
        MAINTENANCE_INTERVAL_SECONDS=0.2,
        OUTBOX_RESEND_SECONDS=0.5,
        RUNNER_SILENT_SECONDS=2,
    )
    route = proxies(server.port)
    token = await sync_to_async(make_runner)("stranded-runner")
    async with RecordingRunner(route.ws_url(), token) as runner:
        await runner.client.open_run("conv-stranded", "stranded-run")
        await runner.client.emit("stranded-run", event("text", "working"))
        route.refuse()  # the runner's host will not get through again
        await asyncio.to_thread(server.stop, True)
    await asyncio.to_thread(server.start)
    # Another runner connects, so the restarted process runs its upkeep sweep.
    bystander = await sync_to_async(make_runner)("bystander")
    async with RecordingRunner(server.ws_url, bystander):
        try:
            await eventually(
                lambda: run_row("stranded-run")["status"] == "lost", 2 + 1 + PROMPT, "lost"
            )
        except AssertionError:
            stranded = await sync_to_async(Runner.objects.get)(name="stranded-runner")
            raise AssertionError(
                "the run of a runner whose server process died stays "
                f"{(await sync_to_async(run_row)('stranded-run'))['status']!r} forever: the "
                f"runner row still says connected={stranded.connected}, "
                f"disconnected_at={stranded.disconnected_at}, last_seen_at="
                f"{stranded.last_seen_at}; only a socket close on a live process starts the "
                "grace period"
            ) from None
    row = await sync_to_async(run_row)("stranded-run")
    assert row["error"] == "runner lost"


# --- (e) a lease expiring while its runner is away ----------------------------------------------------


async def test_it_expires_a_lease_while_its_runner_is_away_and_tells_the_runner_when_it_returns(
    daphne_factory, proxies
):
    ttl = 3
    server = daphne_factory(
        LEASE_TTL_SECONDS=ttl,
        RUNNER_GRACE_SECONDS=60,
        MAINTENANCE_INTERVAL_SECONDS=0.2,
        OUTBOX_RESEND_SECONDS=0.5,
    )
    route = proxies(server.port)
    token = await sync_to_async(make_runner)("away-runner")

    async with RecordingRunner(route.ws_url(), token) as runner:
        c = runner.client
        await c.open_run("conv-away", "away-root")
        leased = []
        for number in range(2):
            request = {
                "requestId": f"leased-{number}",
                "profile": "worker",
                "message": "work on",
                "leaseId": "away-lease",
            }
            leased.append(
                (await c.child_start("away-root", "ext", 1, request, lease_id="away-lease")).run_id
            )
        foreground = await c.child_start(
            "away-root", "ext", 1, {"requestId": "fg", "profile": "worker", "message": "stay"}
        )
        await runner.wait_command("child.execute", PROMPT, count=3)
        await c.emit(leased[0], event("text", "child working"))

        route.refuse()
        route.drop()  # the runner's network goes away; its SDK keeps knocking
        await eventually(
            lambda: not Runner.objects.get(name="away-runner").connected,
            PROMPT,
            "the server noticing the runner is away",
        )
        lease = await sync_to_async(Lease.objects.get)(lease_id="away-lease")
        assert lease.state == "active", f"the lease ended before the runner left ({ttl}s TTL)"

        await eventually(
            lambda: Lease.objects.get(lease_id="away-lease").state == "expired",
            ttl + PROMPT,
            "the lease expiring",
        )
        root_events = await sync_to_async(stored_events)("away-root")
        released = [e for e in root_events if e["kind"] == "lease-released"]
        assert len(released) == 1, root_events
        assert released[0]["data"] == {"leaseId": "away-lease", "state": "expired"}
        for run_id in leased:
            events = await sync_to_async(stored_events)(run_id)
            assert [e["kind"] for e in events if e["runner_index"] is None] == ["cancel-requested"]
            assert_gap_free(events, run_id)
            # Cancelling is asked of the runner; the run stops when the runner says so.
            assert (await sync_to_async(run_row)(run_id))["status"] == "running"
        assert await sync_to_async(stored_events)(foreground.run_id) == []
        assert (await sync_to_async(run_row)("away-root"))["status"] == "running"
        assert runner.received("lease.revoked") == []
        away = await sync_to_async(Runner.objects.get)(name="away-runner")
        assert away.lost_at is None  # away, within its grace period: not lost

        route.accept()  # back: the SDK re-registers and the outbox is delivered
        await runner.wait_command("lease.revoked", 10, leaseId="away-lease")
        for run_id in leased:
            await runner.wait_command("run.cancel", PROMPT, runId=run_id)
            await eventually(
                lambda run_id=run_id: run_row(run_id)["status"] == "cancelled",
                PROMPT,
                f"{run_id} confirmed cancelled",
            )
        assert runner.received("run.cancel", runId=foreground.run_id) == []
        assert c.connections == 2
        await c.finish(foreground.run_id, output="done")
        await c.finish("away-root", output="done")

    assert (await sync_to_async(run_row)(foreground.run_id))["status"] == "succeeded"


# --- (f) a live client that stops reading --------------------------------------------------------------


async def test_it_keeps_a_stalled_live_client_from_slowing_others_or_growing_server_memory(
    daphne_factory, live_clients, operator_token
):
    server = daphne_factory(LIVE_HEARTBEAT_SECONDS=1)
    token, operator = await setup_people("busy-runner", operator_token)
    # 3,000 events, about 90 MB of text: buffering it all would dwarf the allocator's own
    # growth from handling that much (20-35 MB here), so the memory check is not noise.
    batches, per_batch, size = 150, 20, 30_000
    total = batches * per_batch
    payload_mb = total * size / 1e6

    async with RecordingRunner(server.ws_url, token) as runner:
        await runner.client.open_run("conv-busy", "busy-run")
        healthy = await live_clients(live_url(server), operator)
        await healthy.subscribe("busy-run")
        stalled = await asyncio.to_thread(
            RawWebSocket, server.port, "/ws/live/", {"Authorization": f"Bearer {operator}"}
        )
        try:
            assert (await asyncio.to_thread(stalled.read_frame))["type"] == "hello"
            await asyncio.to_thread(
                stalled.send_json, {"type": "subscribe", "runId": "busy-run", "after": 0}
            )
            # Read up to its subscription's answer; from here on nothing reads the socket.
            while (await asyncio.to_thread(stalled.read_frame))["type"] != "subscribed":
                pass
            before_mb = rss_mb(server.process.pid)
            acked = {}
            stream = runner.client.stream("busy-run")
            for batch in range(batches):
                first = batch * per_batch
                await stream.emit(
                    *[event("text", f"{i} " + "x" * size) for i in range(first, first + per_batch)]
                )
                acked[first + per_batch] = time.monotonic()  # sequence of the batch's last
            await healthy.wait_until(
                lambda: healthy.last_sequence("busy-run") == total, 30, "the healthy client"
            )
            await asyncio.sleep(2)  # two heartbeats: the stalled socket's catch-ups ran too
            grown_mb = rss_mb(server.process.pid) - before_mb

            # The client resumes reading: it catches up, or finds a clear close code.
            outcome, sequences = "caught up", []
            deadline = time.monotonic() + 30
            while not sequences or sequences[-1] < total:
                assert time.monotonic() < deadline, (
                    "the stalled client neither caught up nor closed"
                )
                try:
                    frame = await asyncio.to_thread(stalled.read_frame, 30)
                except ConnectionError as exc:
                    outcome = f"dropped: {exc}"
                    break
                if frame is None:
                    outcome = f"closed {stalled.close_code}"
                    break
                if frame["type"] == "events":
                    sequences.extend(e["sequence"] for e in frame["events"])
        finally:
            stalled.close()
        await runner.client.finish("busy-run", output="done")

    # Other clients were not held up: each batch reached the healthy client. A server that
    # waited on the stalled socket would hold it up for good (the wait above fails); the bound
    # here is wide on purpose, for a loaded machine, and `make bench` measures push latency.
    times = healthy.event_times("busy-run")
    lags = {sequence: times[sequence] - at for sequence, at in acked.items()}
    assert max(lags.values()) < 15.0, f"the healthy client lagged {max(lags.values()):.2f}s"
    assert_gap_free(healthy.events("busy-run"), "healthy client")

    if outcome == "caught up":
        assert sequences == list(range(1, total + 1)), "the stalled client's stream has holes"
        # Catching up is fine when it comes from the database; holding everything the client
        # has not read in the server's memory is not (it grows without bound).
        # Buffering it all would grow by the whole payload and more; allocator noise from
        # handling that much stays well under this (20-35 MB of the 90 here).
        assert grown_mb < payload_mb * 0.75, (
            f"the server buffered the stalled client's frames in memory: resident memory grew "
            f"{grown_mb:.0f} MB while {payload_mb:.0f} MB of events went to a socket nobody "
            "read (no back-pressure, no disconnect)"
        )
    else:
        code = stalled.close_code
        # 1008 policy violation, 1009 too big, 1013 try again later, or the app's own 4xxx.
        assert code in (1008, 1009, 1013) or 4000 <= (code or 0) < 5000, (
            f"the stalled client was disconnected without a clear close code: {outcome}"
        )

"""10,000 agents streaming (issue 26 item 4): 1,000 runner sockets, each holding 10 live runs
that send about one event per second each, over two server processes on PostgreSQL + Redis.
Reports answer p99, events stored/s, RSS and CPU per process, and database connections.

python -m bench.fleet10k                 # 1000 sockets x 10 runs, 1 event/s/run, 2 processes
python -m bench.fleet10k 200 10 1 2      # sockets runs-per-socket events/s/run processes
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import redis
import websockets

from bench.fleet import CLK_TCK, REPEATS, SATURATED_BELOW, _cpu_seconds, handshakes, median_of
from bench.push import _percentile
from bench.rpc import Runner
from bench.servers import PG_ADMIN_URL, REDIS_URL, Database, Server
from bench.table import notes, results

SECONDS = int(os.environ.get("BENCH_FLEET_SECONDS", 15))
RAMP_SECONDS = 6
# The one busy socket's step: WINDOWS phases of WINDOW_SECONDS, medians kept (as bench.fleet).
WINDOWS = REPEATS
WINDOW_SECONDS = 5
# Per run, events/s: with 10 runs a socket on 1,000 sockets, 1,000 to 7,000 offered a second.
RAMP = (0.1, 0.2, 0.35, 0.5, 0.7)


def _pg_connections(db: Database) -> int:
    sql = f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{db.name}'"
    done = subprocess.run(
        ["psql", PG_ADMIN_URL, "-tAc", sql], check=True, capture_output=True, text=True
    )
    return int(done.stdout.strip())


def _postgres_cpu_seconds() -> float:
    """CPU seconds of the machine's PostgreSQL: the postmaster's own and those of its children
    that exited (``cutime``/``cstime``, once it has reaped them: a backend ends with its
    connection) plus those of the children alive now."""
    stats = {}
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = path.read_text()
        except OSError:
            continue  # gone meanwhile
        if "(postgres)" in text:
            fields = text.rsplit(")", 1)[1].split()
            stats[int(path.parent.name)] = (int(fields[1]), [int(v) for v in fields[11:15]])
    total = 0
    for _pid, (parent, (utime, stime, cutime, cstime)) in stats.items():
        total += utime + stime
        if parent not in stats:  # the postmaster: its reaped children's time too
            total += cutime + cstime
    return total / CLK_TCK


def _events_stored(db: Database) -> int:
    done = subprocess.run(
        ["psql", db.url, "-tAc", "SELECT count(*) FROM delegation_event"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout.strip())


class Socket:
    """One runner socket with its runs, which emit events on a fixed schedule and send them as
    the SDK's ``RunStream`` does: one frame in flight per run, the events emitted meanwhile in
    the next frame, and after a busy answer (``data.retryAfterMs``) nothing until that delay
    has passed, then everything from the refused frame on in one frame.

    ``flood``: every event its own frame at once, never waiting for an answer (the step
    before issue 39, a runner that ignores answers); a run's frames already in flight behind
    a busy one are then answered as a gap (−32602), superseded by the resend."""

    def __init__(self, index: int, url: str, token: str, runs: int, flood: bool = False):
        self.index, self.url, self.token, self.runs = index, url, token, runs
        self.flood = flood
        self.inflight = [False] * runs
        self.run_ids = [f"f{index}-{r}" for r in range(runs)]
        self.sent_at: dict[int, tuple] = {}  # rpc id -> (run, from, made at, sent at)
        self.answers: list[float] = []  # ms from a frame's first event to its stored answer
        self.turnarounds: list[float] = []  # ms from a frame's send to any answer
        self.refused: list[str] = []
        self.busy = 0
        self.superseded = 0
        self.sent = 0
        self.ids = itertools.count(1000)
        self.made = [0] * runs  # events each run has emitted
        self.made_at: list[list[float]] = [[] for _ in range(runs)]
        self.next_from = [1] * runs  # the first event of each run not yet sent
        self.paused_until = [0.0] * runs
        self.rewound = [False] * runs  # a busy answer sent the run back to resend

    async def open(self):
        async with handshakes(20):
            for attempt in range(10):
                try:
                    self.runner = await Runner.connect(self.url, self.token)
                    break
                # A daphne at load ~19 sometimes closes a handshake before its status line
                # (InvalidMessage): one of 1,000 sockets, on the 800th, in the first run; at
                # load ~23 one socket failed five times in a row.
                except (OSError, websockets.WebSocketException, TimeoutError):
                    if attempt == 9:
                        raise
                    await asyncio.sleep(0.5 * (attempt + 1))
            await self.runner.register()
            for run_id in self.run_ids:
                await self.runner.call(
                    "run.open", {"conversationId": f"c-{run_id}", "runId": run_id}
                )

    @property
    def behind(self) -> bool:
        """Whether some run has events not sent yet (paused by back-pressure)."""
        return any(n <= m for n, m in zip(self.next_from, self.made, strict=True))

    async def read(self):
        ws = self.runner.ws
        try:
            while True:
                frame = json.loads(await ws.recv())
                if "method" in frame:
                    await ws.send(json.dumps({"jsonrpc": "2.0", "id": frame["id"], "result": {}}))
                    continue
                sent = self.sent_at.pop(frame.get("id"), None)
                if sent is None:
                    continue
                run, start, made_at, sent_time = sent
                self.turnarounds.append((time.perf_counter() - sent_time) * 1000)
                self.inflight[run] = False
                error = frame.get("error")
                delay = ((error or {}).get("data") or {}).get("retryAfterMs")
                if error is None:
                    self.answers.append((time.perf_counter() - made_at) * 1000)
                    await self._send(run)  # what a pause or a full frame left behind
                elif delay is not None:
                    self.busy += 1
                    self.rewound[run] = True
                    self.next_from[run] = min(self.next_from[run], start)
                    self.paused_until[run] = time.perf_counter() + delay / 1000
                    asyncio.get_running_loop().call_later(
                        delay / 1000, lambda run=run: asyncio.ensure_future(self._send(run))
                    )
                elif error.get("code") == -32602 and self.rewound[run]:
                    self.superseded += 1
                else:
                    self.refused.append(str(error.get("message", error)))
        except websockets.ConnectionClosed as closed:
            self.refused.append(f"closed {closed.rcvd.code if closed.rcvd else '?'}")

    async def _send(self, run: int):
        """Everything ``run`` has not sent yet, from ``next_from``, unless it is paused."""
        start, last = self.next_from[run], self.made[run]
        if start > last or time.perf_counter() < self.paused_until[run]:
            return
        if self.inflight[run] and not self.flood:
            return  # sent with the next frame, once this one is answered
        self.inflight[run] = True
        last = min(last, start + 99)  # the SDK's frames hold at most a few hundred
        self.next_from[run] = last + 1
        rpc_id = next(self.ids)
        params = {
            "runId": self.run_ids[run],
            "from": start,
            "events": [{"kind": "text-delta", "text": "hello world " * 4}] * (last - start + 1),
        }
        self.sent_at[rpc_id] = (run, start, self.made_at[run][start - 1], time.perf_counter())
        self.sent += 1
        with contextlib.suppress(websockets.ConnectionClosed):  # a resend after the end
            await self.runner.ws.send(
                json.dumps(
                    {"jsonrpc": "2.0", "id": rpc_id, "method": "run.event", "params": params}
                )
            )

    async def stream(self, start: float, rate_per_run: float, seconds: float):
        """Run ``k % runs`` emits an event at ``start + k / (rate * runs)``: the socket's runs
        take turns, so the socket offers ``rate * runs`` events a second, evenly spaced, one
        per frame unless back-pressure paused the run."""
        interval = 1 / (rate_per_run * self.runs)
        for k in range(int(seconds / interval)):
            delay = start + k * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            r = k % self.runs
            self.made[r] += 1
            self.made_at[r].append(time.perf_counter())
            await self._send(r)


async def _phase(db, servers, sockets, runs, rate, seconds) -> dict:
    """Every socket streams at ``rate`` events/s per run for ``seconds``; then up to 60 s for
    the answers (and the resends back-pressure asked for)."""
    for s in sockets:
        s.answers, s.refused, s.busy, s.superseded, s.sent = [], [], 0, 0, 0
        s.turnarounds = []
    stored_before = _events_stored(db)
    cpu_before = [_cpu_seconds(s.proc.pid) for s in servers]
    postgres_before = _postgres_cpu_seconds()
    client_before = time.process_time()
    t0 = time.perf_counter()
    # Staggered: socket i starts i/N of a frame interval later, so frames arrive evenly.
    interval = 1 / (rate * runs)
    starts = [t0 + 0.2 + interval * i / len(sockets) for i in range(len(sockets))]
    await asyncio.gather(
        *(s.stream(st, rate, seconds) for s, st in zip(sockets, starts, strict=True))
    )
    sending = time.perf_counter() - t0
    connections = _pg_connections(db)
    rss = [round(s.rss_mb(), 1) for s in servers]
    deadline = time.monotonic() + 60
    while any(s.sent_at or s.behind for s in sockets) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    drained = time.perf_counter() - t0
    cpu = [_cpu_seconds(s.proc.pid) - c for s, c in zip(servers, cpu_before, strict=True)]
    client_cpu = time.process_time() - client_before
    postgres_cpu = _postgres_cpu_seconds() - postgres_before
    stored = _events_stored(db) - stored_before
    answers = [a for s in sockets for a in s.answers]
    turnarounds = [a for s in sockets for a in s.turnarounds]
    refused = [r for s in sockets for r in s.refused]
    if refused:
        notes.append(f"fleet10k: refused {len(refused)}, first: {refused[0]}")
    offered = len(sockets) * runs * rate
    busy = sum(s.busy for s in sockets)
    return {
        "offered_per_s": offered,
        "sent_per_s": round(sum(s.sent for s in sockets) / sending, 1),
        "events_stored_per_s": round(stored / drained, 1),
        # Over capacity: the server asked for back-pressure, or stored well below the offered
        # rate. Its latencies then measure the backlog (bench.compare holds it to stored/s).
        "saturated": bool(busy) or stored / drained < SATURATED_BELOW * offered,
        "answer_p50_ms": round(_percentile(answers, 0.5), 1) if answers else None,
        "answer_p99_ms": round(_percentile(answers, 0.99), 1) if answers else None,
        # A frame's send to its answer, stored or busy: how long the server let it wait.
        "frame_answer_p99_ms": round(_percentile(turnarounds, 0.99), 1) if turnarounds else None,
        "busy": busy,
        "superseded": sum(s.superseded for s in sockets),
        "refused": len(refused),
        "unanswered_after_60s": sum(len(s.sent_at) for s in sockets),
        "unsent_after_60s": sum(
            m - n + 1 for s in sockets for n, m in zip(s.next_from, s.made, strict=True) if n <= m
        ),
        "rss_mb_max_per_process": max(rss),
        "cpu_pct_per_process": max(round(c * 100 / drained, 1) for c in cpu),
        "client_cpu_pct": round(client_cpu * 100 / drained, 1),
        # Where the machine's CPU went (issue 39): the servers and PostgreSQL serve, the
        # bench's own client (every runner and agent) only stands in for other machines.
        "servers_cpu_pct": round(sum(cpu) * 100 / drained, 1),
        "postgres_cpu_pct": round(postgres_cpu * 100 / drained, 1),
        # Events stored per second of CPU the serving side (servers + PostgreSQL) used.
        "stored_per_serving_cpu_s": round(stored / max(sum(cpu) + postgres_cpu, 1e-9), 1),
        "db_connections": connections,
    }


# Counts that add up over a step's windows rather than take their median.
SUMMED = ("busy", "superseded", "refused", "unanswered_after_60s", "unsent_after_60s")


async def _measure(
    db, servers, tokens, runs, rate, seconds, ramp=(), flood=False, windows=1
) -> dict:
    sockets = [
        Socket(i, servers[i % len(servers)].ws, token, runs, flood)
        for i, token in enumerate(tokens)
    ]
    opened = time.perf_counter()
    await asyncio.gather(*(s.open() for s in sockets))
    figures = {
        "sockets": len(sockets),
        "agents": len(sockets) * runs,
        "open_seconds": round(time.perf_counter() - opened, 1),
    }
    readers = [asyncio.ensure_future(s.read()) for s in sockets]
    await asyncio.sleep(1)
    # The client's sockets out of the collector's way (bench.fleet: a full collection over
    # them pauses the client, and every frame in flight would seem late).
    gc.freeze()
    # Where back-pressure starts (issue 39): the same sockets at rising rates, drained between.
    # Steps under capacity run WINDOWS phases, medians kept: a single 6 s phase's answer p99
    # at 1,000/s read 82 then 45 ms in two runs of one build. From the first step over
    # capacity on, one phase each: their latencies measure the backlog and are not compared.
    limit, over = None, False
    for step in ramp:
        phases = [
            await _phase(db, servers, sockets, runs, step, RAMP_SECONDS)
            for _ in range(1 if over else WINDOWS)
        ]
        found = phases[0] if len(phases) == 1 else median_of(phases, "answer_p99_ms", SUMMED)
        over = over or found["saturated"]
        offered = int(found["offered_per_s"])
        for name in (
            "events_stored_per_s",
            "answer_p99_ms",
            "frame_answer_p99_ms",
            "busy",
            "saturated",
            "answer_p99_ms_windows",
        ):
            if name in found:
                figures[f"ramp_{offered}_{name}"] = found[name]
        if limit is None and found["busy"]:
            limit = offered
    # ``windows`` phases of ``seconds`` each on the same sockets, the median of each figure
    # kept (bench.fleet.median_of): one phase's answer p99 swung 2x between runs of one build.
    found = [await _phase(db, servers, sockets, runs, rate, seconds) for _ in range(windows)]
    figures.update(found[0] if windows == 1 else median_of(found, "answer_p99_ms", SUMMED))
    if ramp:
        figures["backpressure_from_per_s"] = (
            limit
            if limit is not None
            else (int(figures["offered_per_s"]) if figures["busy"] else None)
        )
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    await asyncio.gather(*(s.runner.ws.close() for s in sockets), return_exceptions=True)
    gc.unfreeze()
    return figures


def fleet10k(
    sockets: int = 1000,
    runs: int = 10,
    rate: float = 1.0,
    processes: int = 2,
    group_max: int | None = None,
    keepalive: str | None = None,
    ramp: tuple = (),
    flood: bool = False,
    windows: int = 1,
):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Inherited by the servers: each holds half the sockets plus its database connections.
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    db = Database("postgres")
    try:
        tokens = json.loads(db.python("bench.seed", "runners", "--runs", str(sockets)))["tokens"]
        redis.Redis.from_url(REDIS_URL).flushdb()
        env = {"REDIS_URL": REDIS_URL, "LIVE_FANOUT": "process", "UPKEEP_IN_PROCESS": "false"}
        if group_max is not None:
            env["RUN_EVENT_GROUP_MAX"] = str(group_max)  # 1: every frame its own commit
        if keepalive is not None:
            env["RUNNER_KEEPALIVE"] = keepalive  # "socket": a timer per socket, as before
        servers = [Server(db, **env) for _ in range(processes)]
        try:
            seconds = SECONDS if windows == 1 else WINDOW_SECONDS
            figures = asyncio.run(
                _measure(db, servers, tokens, runs, rate, seconds, ramp, flood, windows)
            )
        finally:
            for server in servers:
                server.stop()
    finally:
        db.close()
    key = f"fleet10k_{sockets}s_{runs}r_{processes}p" + ("_ungrouped" if group_max == 1 else "")
    key += "_socket_keepalive" if keepalive == "socket" else ""
    key += "_flood" if flood else ""
    for name, value in figures.items():
        results[f"{key}_{name}"] = value
    print(key, json.dumps(figures), flush=True)
    return figures


# One process, 100 sockets x 10 runs at 5 events/s a run: 5,000/s offered, more than one
# process stores here, so it runs saturated. What it stores per second of the serving side's
# CPU is the unit the 1,000-socket step is held to (issue 39).
CALIBRATION = (100, 10, 5.0, 1)
CALIBRATION_KEY = "fleet10k_100s_10r_1p"


def calibrated_fleet10k(ramp: tuple = RAMP) -> None:
    """The calibration step, then the 1,000-socket step held to it.

    ``stored_vs_calibration``: the step's stored/s over what the calibration's rate per
    serving CPU second (servers + PostgreSQL) makes of the cores the bench's own client left
    free; ``_all_cores`` the same over every core of the machine, the client's included. Both
    ≥ 0.9 mean two processes at 1,000 sockets turn CPU into stored events as one process at
    100 does: their upkeep, waits and back-pressure do not waste it."""
    fleet10k(*CALIBRATION)
    figures = fleet10k(ramp=ramp)
    per_core = results.get(f"{CALIBRATION_KEY}_stored_per_serving_cpu_s")
    if not per_core:
        notes.append("fleet10k: no calibration figure to hold the step to")
        return
    cores = os.cpu_count() or 1
    free = max(cores - figures["client_cpu_pct"] / 100, 0.1)
    key = "fleet10k_1000s_10r_2p"
    results[f"{key}_stored_vs_calibration"] = round(
        figures["events_stored_per_s"] / (per_core * free), 2
    )
    results[f"{key}_stored_vs_calibration_all_cores"] = round(
        figures["events_stored_per_s"] / (per_core * cores), 2
    )


def one_busy_socket() -> None:
    """One runner socket multiplexing 50 agents at 20 frames/s each (1,000 frames/s): with
    the group commit of frames waiting behind each other, and with every frame alone."""
    fleet10k(1, 50, 20.0, 1, windows=WINDOWS)
    fleet10k(1, 50, 20.0, 1, group_max=1, windows=WINDOWS)


def main(argv: list[str]) -> None:
    """``sockets runs rate processes [socket] [ramp] [flood]``: ``socket`` keeps the
    per-socket keep-alive (the baseline); ``ramp`` first steps the rate up to find where
    back-pressure starts; ``flood`` sends every event at once in its own frame."""
    words = [a for a in argv if a not in ("socket", "ramp", "flood")]
    sockets, runs, rate, processes = (words + [None] * 4)[:4]
    fleet10k(
        int(sockets or 1000),
        int(runs or 10),
        float(rate or 1.0),
        int(processes or 2),
        keepalive="socket" if "socket" in argv else None,
        ramp=RAMP if "ramp" in argv else (),
        flood="flood" in argv,
    )
    print("\n".join(notes))


if __name__ == "__main__":
    main(sys.argv[1:])

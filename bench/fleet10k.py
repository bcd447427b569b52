"""10,000 agents streaming (issue 26 item 4): 1,000 runner sockets, each holding 10 live runs
that send about one event per second each, over two server processes on PostgreSQL + Redis.
Reports answer p99, events stored/s, RSS and CPU per process, and database connections.

python -m bench.fleet10k                 # 1000 sockets x 10 runs, 1 event/s/run, 2 processes
python -m bench.fleet10k 200 10 1 2      # sockets runs-per-socket events/s/run processes
"""

from __future__ import annotations

import asyncio
import itertools
import json
import resource
import subprocess
import sys
import time

import redis
import websockets

from bench.fleet import _cpu_seconds, handshakes
from bench.push import _percentile
from bench.rpc import Runner
from bench.servers import PG_ADMIN_URL, REDIS_URL, Database, Server
from bench.table import notes, results

SECONDS = 15


def _pg_connections(db: Database) -> int:
    sql = f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{db.name}'"
    done = subprocess.run(
        ["psql", PG_ADMIN_URL, "-tAc", sql], check=True, capture_output=True, text=True
    )
    return int(done.stdout.strip())


def _events_stored(db: Database) -> int:
    done = subprocess.run(
        ["psql", db.url, "-tAc", "SELECT count(*) FROM delegation_event"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout.strip())


class Socket:
    """One runner socket with its runs; sends on a fixed schedule, never waiting for answers."""

    def __init__(self, index: int, url: str, token: str, runs: int):
        self.index, self.url, self.token, self.runs = index, url, token, runs
        self.run_ids = [f"f{index}-{r}" for r in range(runs)]
        self.sent_at: dict[int, float] = {}
        self.answers: list[float] = []
        self.refused: list[str] = []
        self.sent = 0
        self.ids = itertools.count(1000)

    async def open(self):
        async with handshakes(20):
            for attempt in range(5):
                try:
                    self.runner = await Runner.connect(self.url, self.token)
                    break
                # A daphne at load ~19 sometimes closes a handshake before its status line
                # (InvalidMessage): one of 1,000 sockets, on the 800th, in the first run.
                except (OSError, websockets.WebSocketException, TimeoutError):
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.5 * (attempt + 1))
            await self.runner.register()
            for run_id in self.run_ids:
                await self.runner.call(
                    "run.open", {"conversationId": f"c-{run_id}", "runId": run_id}
                )

    async def read(self):
        ws = self.runner.ws
        try:
            while True:
                frame = json.loads(await ws.recv())
                if "method" in frame:
                    await ws.send(json.dumps({"jsonrpc": "2.0", "id": frame["id"], "result": {}}))
                    continue
                started = self.sent_at.pop(frame.get("id"), None)
                if started is None:
                    continue
                if "error" in frame:
                    self.refused.append(str(frame["error"].get("message", frame["error"])))
                else:
                    self.answers.append((time.perf_counter() - started) * 1000)
        except websockets.ConnectionClosed as closed:
            self.refused.append(f"closed {closed.rcvd.code if closed.rcvd else '?'}")

    async def stream(self, start: float, rate_per_run: float, seconds: float):
        """Run ``k % runs`` sends at ``start + k / (rate * runs)``: the socket's runs take
        turns, so the socket offers ``rate * runs`` frames a second, evenly spaced."""
        ws = self.runner.ws
        interval = 1 / (rate_per_run * self.runs)
        seq = [0] * self.runs
        for k in range(int(seconds / interval)):
            delay = start + k * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            r = k % self.runs
            seq[r] += 1
            rpc_id = next(self.ids)
            params = {
                "runId": self.run_ids[r],
                "from": seq[r],
                "events": [{"kind": "text-delta", "text": "hello world " * 4}],
            }
            self.sent_at[rpc_id] = time.perf_counter()
            await ws.send(
                json.dumps(
                    {"jsonrpc": "2.0", "id": rpc_id, "method": "run.event", "params": params}
                )
            )
            self.sent += 1


async def _measure(db, servers, tokens, runs, rate, seconds) -> dict:
    sockets = [
        Socket(i, servers[i % len(servers)].ws, token, runs) for i, token in enumerate(tokens)
    ]
    opened = time.perf_counter()
    await asyncio.gather(*(s.open() for s in sockets))
    open_seconds = time.perf_counter() - opened
    readers = [asyncio.ensure_future(s.read()) for s in sockets]
    await asyncio.sleep(1)
    stored_before = _events_stored(db)
    cpu_before = [_cpu_seconds(s.proc.pid) for s in servers]
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
    while any(s.sent_at for s in sockets) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    drained = time.perf_counter() - t0
    cpu = [_cpu_seconds(s.proc.pid) - c for s, c in zip(servers, cpu_before, strict=True)]
    client_cpu = time.process_time() - client_before
    stored = _events_stored(db) - stored_before
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    await asyncio.gather(*(s.runner.ws.close() for s in sockets), return_exceptions=True)
    answers = [a for s in sockets for a in s.answers]
    refused = [r for s in sockets for r in s.refused]
    unanswered = sum(len(s.sent_at) for s in sockets)
    sent = sum(s.sent for s in sockets)
    if refused:
        notes.append(f"fleet10k: refused {len(refused)}, first: {refused[0]}")
    return {
        "sockets": len(sockets),
        "agents": len(sockets) * runs,
        "open_seconds": round(open_seconds, 1),
        "offered_per_s": len(sockets) * runs * rate,
        "sent_per_s": round(sent / sending, 1),
        "events_stored_per_s": round(stored / drained, 1),
        "answer_p50_ms": round(_percentile(answers, 0.5), 1) if answers else None,
        "answer_p99_ms": round(_percentile(answers, 0.99), 1) if answers else None,
        "refused": len(refused),
        "unanswered_after_60s": unanswered,
        "rss_mb_max_per_process": max(rss),
        "cpu_pct_per_process": max(round(c * 100 / drained, 1) for c in cpu),
        "client_cpu_pct": round(client_cpu * 100 / drained, 1),
        "db_connections": connections,
    }


def fleet10k(
    sockets: int = 1000,
    runs: int = 10,
    rate: float = 1.0,
    processes: int = 2,
    group_max: int | None = None,
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
        servers = [Server(db, **env) for _ in range(processes)]
        try:
            figures = asyncio.run(_measure(db, servers, tokens, runs, rate, SECONDS))
        finally:
            for server in servers:
                server.stop()
    finally:
        db.close()
    key = f"fleet10k_{sockets}s_{runs}r_{processes}p" + ("_ungrouped" if group_max == 1 else "")
    for name, value in figures.items():
        results[f"{key}_{name}"] = value
    print(key, json.dumps(figures), flush=True)
    return figures


def one_busy_socket() -> None:
    """One runner socket multiplexing 50 agents at 20 frames/s each (1,000 frames/s): with
    the group commit of frames waiting behind each other, and with every frame alone."""
    fleet10k(1, 50, 20.0, 1)
    fleet10k(1, 50, 20.0, 1, group_max=1)


def main(argv: list[str]) -> None:
    sockets, runs, rate, processes = (argv + [None] * 4)[:4]
    fleet10k(int(sockets or 1000), int(runs or 10), float(rate or 1.0), int(processes or 2))
    print("\n".join(notes))


if __name__ == "__main__":
    main(sys.argv[1:])

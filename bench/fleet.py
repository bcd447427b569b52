"""Live at fleet scale (issue 26): a pipelined runner that sends at the offered rate whatever
the answer time, watchers spread over several server processes (PostgreSQL + Redis), and the
cost of each event: Redis messages (``INFO commandstats``), the processes' live reads and
doorbells (``/metrics``), CPU and RSS per 1,000 events delivered.

python -m bench.fleet                       # the table of configurations below
python -m bench.fleet 2 20 200 process      # processes watchers rate fan-out [layer]
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import redis

from bench.push import _percentile, _watcher
from bench.rpc import Runner
from bench.servers import REDIS_URL, Database, Server
from bench.table import notes, results

SECONDS = 5
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _commandstats(client) -> dict[str, int]:
    return {name: stats["calls"] for name, stats in client.info("commandstats").items()}


def _scrape(server: Server) -> dict[str, float]:
    text = urllib.request.urlopen(server.http + "/metrics", timeout=10).read().decode()
    found = {}
    for name in ("canopy_live_reads_total", "canopy_live_doorbells_total"):
        match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
        found[name] = float(match.group(1)) if match else 0.0
    return found


async def pipelined(runner: Runner, run_id: str, rate: float, seconds: float) -> dict:
    """Send ``run.event`` at ``rate`` per second for ``seconds``, never waiting for answers;
    a reader takes the answers (and accepts server commands) meanwhile."""
    ws = runner.ws
    sent_at: dict[int, float] = {}
    answers: list[float] = []
    done = asyncio.Event()
    total = int(rate * seconds)

    async def read():
        while len(answers) < total:
            frame = json.loads(await ws.recv())
            if "method" in frame:
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": frame["id"], "result": {}}))
                continue
            started = sent_at.pop(frame.get("id"), None)
            if started is not None:
                answers.append((time.perf_counter() - started) * 1000)
        done.set()

    reader = asyncio.ensure_future(read())
    ids = itertools.count(10_000)
    start = time.perf_counter()
    for index in range(total):
        delay = start + index / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        rpc_id = next(ids)
        event = {"kind": "text-delta", "text": f"t={time.perf_counter_ns()}"}
        params = {"runId": run_id, "from": index + 1, "events": [event]}
        sent_at[rpc_id] = time.perf_counter()
        await ws.send(
            json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "run.event", "params": params})
        )
    sending = time.perf_counter() - start
    try:
        await asyncio.wait_for(done.wait(), 60)
    except TimeoutError:
        notes.append(f"fleet: {len(answers)} of {total} answers within 60 s")
    reader.cancel()
    return {
        "offered_per_s": rate,
        "sent_per_s": round(total / sending, 1),
        "answer_p50_ms": round(_percentile(answers, 0.5), 2) if answers else None,
        "answer_p99_ms": round(_percentile(answers, 0.99), 2) if answers else None,
    }


async def _measure(servers: list[Server], token: str, api_token: str, watchers: int, rate: float):
    runner = await Runner.connect(servers[0].ws, token)
    await runner.register()
    run_id = f"fleet-{time.time_ns()}"
    await runner.call("run.open", {"conversationId": f"c-{run_id}", "runId": run_id})
    latencies: list[float] = []
    readies = [asyncio.Event() for _ in range(watchers)]
    tasks = [
        asyncio.ensure_future(
            _watcher(servers[i % len(servers)].ws, api_token, run_id, latencies, ready)
        )
        for i, ready in enumerate(readies)
    ]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
    await asyncio.sleep(0.5)
    client = redis.Redis.from_url(REDIS_URL)
    before = _commandstats(client)
    cpu_before = [_cpu_seconds(s.proc.pid) for s in servers]
    scraped_before = [_scrape(s) for s in servers]
    sent = await pipelined(runner, run_id, rate, SECONDS)
    deadline = time.monotonic() + 30
    total = int(rate * SECONDS)
    while len(latencies) < total * watchers and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    after = _commandstats(client)
    cpu = sum(_cpu_seconds(s.proc.pid) - c for s, c in zip(servers, cpu_before, strict=True))
    scraped_after = [_scrape(s) for s in servers]
    client.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await runner.ws.close()

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    delivered = len(latencies)
    if delivered != total * watchers:
        notes.append(f"fleet: {delivered} of {total * watchers} deliveries observed")
    reads = sum(
        a["canopy_live_reads_total"] - b["canopy_live_reads_total"]
        for a, b in zip(scraped_after, scraped_before, strict=True)
    )
    bells = sum(
        a["canopy_live_doorbells_total"] - b["canopy_live_doorbells_total"]
        for a, b in zip(scraped_after, scraped_before, strict=True)
    )
    return {
        **sent,
        "push_p50_ms": round(_percentile(latencies, 0.5), 2) if latencies else None,
        "push_p99_ms": round(_percentile(latencies, 0.99), 2) if latencies else None,
        "delivered": delivered,
        # Redis commands per event: the sorted-set layer ZADDs each message to its channel
        # (and its receive ZADDs it again to a backup queue while it hands it over); pub/sub
        # PUBLISHes once per group. Doorbells taken: messages the processes received.
        "redis_zadd_per_event": round(delta("cmdstat_zadd") / total, 2),
        "redis_publish_per_event": round(delta("cmdstat_publish") / total, 2),
        "redis_bzpopmin_per_event": round(delta("cmdstat_bzpopmin") / total, 2),
        "live_reads_per_event_per_process": round(reads / total / len(servers), 3),
        "doorbells_taken_per_event": round(bells / total, 2),
        "cpu_ms_per_1000_delivered": round(cpu * 1000 / max(delivered, 1) * 1000, 1),
        "rss_mb_per_process": round(max(s.rss_mb() for s in servers), 1),
    }


def fleet(processes: int, watchers: int, rate: float, fanout: str = "process", layer="core"):
    db = Database("postgres")
    try:
        token = db.runner_token("fleet")
        api_token = json.loads(db.python("bench.seed", "operator"))["apiToken"]
        env = {
            "REDIS_URL": REDIS_URL,
            "LIVE_FANOUT": fanout,
            "REDIS_CHANNEL_LAYER": layer,
            "LIVE_MAX_SOCKETS_PER_USER": str(watchers + 10),
            "UPKEEP_IN_PROCESS": "false",
        }
        redis.Redis.from_url(REDIS_URL).flushdb()
        servers = [Server(db, **env) for _ in range(processes)]
        try:
            return asyncio.run(_measure(servers, token, api_token, watchers, rate))
        finally:
            for server in servers:
                server.stop()
    finally:
        db.close()


CONFIGURATIONS = [
    (2, 20, 200, "socket", "core"),
    (2, 20, 200, "process", "core"),
    (2, 20, 200, "socket", "pubsub"),
    (2, 20, 50, "socket", "core"),
    (2, 20, 50, "process", "core"),
    (2, 20, 50, "socket", "pubsub"),
    (4, 200, 50, "socket", "core"),
    (4, 200, 50, "process", "core"),
    (4, 200, 200, "process", "core"),
]


def main(argv: list[str]) -> None:
    configs = CONFIGURATIONS
    if argv:
        p, n, r, *rest = argv
        configs = [(int(p), int(n), float(r), *(rest or ["process"]))]
    for config in configs:
        key = "fleet_{}p_{}w_{:g}r_{}{}".format(
            *config[:4], "" if len(config) < 5 or config[4] == "core" else "_" + config[4]
        )
        figures = fleet(*config)
        results[key] = figures
        print(key, json.dumps(figures), flush=True)
    print("\n".join(notes))


if __name__ == "__main__":
    main(sys.argv[1:])

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
import websockets

from bench.push import _percentile
from bench.rpc import Runner
from bench.servers import REDIS_URL, Database, Server
from bench.table import notes, results
from canopy.proxy import ForegroundNginx

SECONDS = 5
_handshakes: dict = {}


def handshakes(limit: int) -> asyncio.Semaphore:
    """At most ``limit`` handshakes at once (more overflow a loaded daphne's accept queue);
    one semaphore per event loop, since each configuration runs in a loop of its own."""
    loop = asyncio.get_running_loop()
    return _handshakes.setdefault((loop, limit), asyncio.Semaphore(limit))


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


async def pipelined(
    runner: Runner, run_id: str, rate: float, seconds: float, answered: dict | None = None
) -> dict:
    """Send ``run.event`` at ``rate`` per second for ``seconds``, never waiting for answers;
    a reader takes the answers (and accepts server commands) meanwhile. ``answered`` gets
    each event's answer time (ns) keyed by the send time it carries."""
    ws = runner.ws
    answered = {} if answered is None else answered
    sent_at: dict[int, tuple[float, int]] = {}
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
                answers.append((time.perf_counter() - started[0]) * 1000)
                answered[started[1]] = time.perf_counter_ns()
        done.set()

    reader = asyncio.ensure_future(read())
    ids = itertools.count(10_000)
    start = time.perf_counter()
    for index in range(total):
        delay = start + index / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        rpc_id = next(ids)
        sent_ns = time.perf_counter_ns()
        event = {"kind": "text-delta", "text": f"t={sent_ns}"}
        params = {"runId": run_id, "from": index + 1, "events": [event]}
        sent_at[rpc_id] = (time.perf_counter(), sent_ns)
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


async def _watch(url: str, api_token: str, run_id: str, seen: list, ready: asyncio.Event):
    """A live socket recording (send time, arrival time) of every event, in ns."""
    async with handshakes(10):
        for attempt in range(5):
            try:
                ws = await websockets.connect(
                    f"{url}/ws/live/",
                    additional_headers={"Authorization": f"Bearer {api_token}"},
                    open_timeout=30,
                )
                break
            except (OSError, websockets.InvalidHandshake, TimeoutError):
                if attempt == 4:
                    raise
                await asyncio.sleep(0.5 * (attempt + 1))
    await ws.send(json.dumps({"type": "subscribe", "runId": run_id, "after": 0}))
    try:
        while True:
            frame = json.loads(await ws.recv())
            if frame.get("type") == "subscribed":
                ready.set()
            if frame.get("type") == "events":
                now = time.perf_counter_ns()
                for event in frame["events"]:
                    if event.get("text", "").startswith("t="):
                        seen.append((int(event["text"][2:]), now))
    finally:
        await ws.close()


async def _measure(
    servers: list[Server], token: str, api_token: str, watchers: int, rate: float, front=None
):
    # Through nginx, the runner and every watcher connect to the proxy, which spreads them.
    urls = [front] if front else [server.ws for server in servers]
    runner = await Runner.connect(urls[0], token)
    await runner.register()
    run_id = f"fleet-{time.time_ns()}"
    await runner.call("run.open", {"conversationId": f"c-{run_id}", "runId": run_id})
    seen: list[tuple[int, int]] = []
    answered: dict[int, int] = {}
    readies = [asyncio.Event() for _ in range(watchers)]
    tasks = [
        asyncio.ensure_future(_watch(urls[i % len(urls)], api_token, run_id, seen, ready))
        for i, ready in enumerate(readies)
    ]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 120)
    await asyncio.sleep(0.5)
    client = redis.Redis.from_url(REDIS_URL)
    before = _commandstats(client)
    cpu_before = [_cpu_seconds(s.proc.pid) for s in servers]
    scraped_before = [_scrape(s) for s in servers]
    sent = await pipelined(runner, run_id, rate, SECONDS, answered)
    deadline = time.monotonic() + 30
    total = int(rate * SECONDS)
    while len(seen) < total * watchers and time.monotonic() < deadline:
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

    delivered = len(seen)
    latencies = [(now - sent_ns) / 1e6 for sent_ns, now in seen]
    # From the runner's answer (the commit) to the watcher: the fan-out alone, whatever the
    # ingest backlog in front of it.
    fanout = [(now - answered[s]) / 1e6 for s, now in seen if s in answered]
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
        "after_answer_p50_ms": round(_percentile(fanout, 0.5), 2) if fanout else None,
        "after_answer_p99_ms": round(_percentile(fanout, 0.99), 2) if fanout else None,
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


def fleet(
    processes: int,
    watchers: int,
    rate: float,
    fanout: str = "process",
    layer: str = "core",
    via: str = "direct",
    group_max: int | None = None,
):
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
        if group_max is not None:
            env["RUN_EVENT_GROUP_MAX"] = str(group_max)  # 1: every frame its own commit
        redis.Redis.from_url(REDIS_URL).flushdb()
        servers = [Server(db, **env) for _ in range(processes)]
        front = None
        if via == "nginx":
            front = ForegroundNginx([server.port for server in servers]).start()
        try:
            return asyncio.run(
                _measure(servers, token, api_token, watchers, rate, front and front.ws_base)
            )
        finally:
            if front is not None:
                front.close()
            for server in servers:
                server.stop()
    finally:
        db.close()


CONFIGURATIONS = [
    (1, 20, 200, "process", "core"),
    # Before and after the group commit of pipelined frames, in the same run.
    (2, 20, 200, "process", "core", "direct", 1),
    (4, 200, 200, "process", "core", "direct", 1),
    (2, 20, 200, "socket", "core"),
    (2, 20, 200, "process", "core"),
    (2, 20, 200, "socket", "pubsub"),
    (2, 20, 50, "socket", "core"),
    (2, 20, 50, "process", "core"),
    (2, 20, 50, "socket", "pubsub"),
    (4, 200, 50, "socket", "core"),
    (4, 200, 50, "process", "core"),
    (4, 200, 200, "process", "core"),
    (2, 20, 50, "process", "core", "nginx"),
]


def main(argv: list[str]) -> None:
    configs = CONFIGURATIONS
    if argv:
        p, n, r, *rest = argv
        configs = [(int(p), int(n), float(r), *(rest or ["process"]))]
    for config in configs:
        key = "fleet_{}p_{}w_{:g}r_{}".format(*config[:4])
        key += "".join(f"_{extra}" for extra in config[4:6] if extra not in ("core", "direct"))
        key += "_ungrouped" if config[6:] == (1,) else ""
        figures = fleet(*config)
        for name, value in figures.items():
            results[f"{key}_{name}"] = value
        print(key, json.dumps(figures), flush=True)
    print("\n".join(notes))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Live at fleet scale (issue 26): a pipelined runner that sends at the offered rate whatever
the answer time, watchers spread over several server processes (PostgreSQL + Redis), and the
cost of each event: Redis messages (``INFO commandstats``), the processes' live reads and
doorbells (``/metrics``), CPU and RSS per 1,000 events delivered.

python -m bench.fleet                       # the table of configurations below
python -m bench.fleet 2 20 200 process      # processes watchers rate fan-out [layer]
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import os
import re
import statistics
import sys
import time
import urllib.request
from array import array
from pathlib import Path

import redis
import websockets

from bench.push import _percentile
from bench.rpc import Runner
from bench.servers import REDIS_URL, Database, Server
from bench.table import notes, results
from canopy.proxy import ForegroundNginx

SECONDS = 5
SATURATED_BELOW = 0.9
REPEATS = int(os.environ.get("BENCH_FLEET_REPEATS", 3))
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
    runner: Runner,
    run_id: str,
    rate: float,
    seconds: float,
    answered: dict | None = None,
    first: int = 1,
) -> dict:
    """Send ``run.event`` at ``rate`` per second for ``seconds``, never waiting for answers;
    a reader takes the answers (and accepts server commands) meanwhile. ``answered`` gets
    each event's answer time (ns) keyed by the send time it carries; ``first`` is the first
    event's sequence (a run continued from an earlier window).

    ``answered_per_s`` is the frames over the time from the first send to the last answer:
    the offered rate when the server kept up, its capacity when it did not. A window
    answered below 0.9 of the offered rate is ``saturated``: its latencies then grow with
    the window's length (the backlog), not with the machine, and bench.compare holds such
    a window to its throughput instead."""
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
        params = {"runId": run_id, "from": first + index, "events": [event]}
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
    answering = time.perf_counter() - start
    answered_per_s = len(answers) / answering
    return {
        "offered_per_s": rate,
        "sent_per_s": round(total / sending, 1),
        "answered_per_s": round(answered_per_s, 1),
        "saturated": answered_per_s < SATURATED_BELOW * rate,
        "answer_p50_ms": round(_percentile(answers, 0.5), 2) if answers else None,
        "answer_p99_ms": round(_percentile(answers, 0.99), 2) if answers else None,
    }


async def _watch(url: str, api_token: str, run_id: str, seen: Seen, ready: asyncio.Event):
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
                        seen.add(int(event["text"][2:]), now)
    finally:
        await ws.close()


class Seen:
    """Every delivery's (send ns, arrival ns), in two arrays of machine integers: a list of
    tuples grew by 200,000 a window, and the collector's passes over it paused the client."""

    def __init__(self):
        self.sent, self.arrived = array("q"), array("q")

    def __len__(self) -> int:
        return len(self.arrived)

    def add(self, sent_ns: int, arrived_ns: int) -> None:
        self.sent.append(sent_ns)
        self.arrived.append(arrived_ns)

    def since(self, index: int):
        return zip(self.sent[index:], self.arrived[index:], strict=True)


async def _measure(
    servers: list[Server], token: str, api_token: str, watchers: int, rate: float, front=None
):
    # Through nginx, the runner and every watcher connect to the proxy, which spreads them.
    urls = [front] if front else [server.ws for server in servers]
    runner = await Runner.connect(urls[0], token)
    await runner.register()
    run_id = f"fleet-{time.time_ns()}"
    await runner.call("run.open", {"conversationId": f"c-{run_id}", "runId": run_id})
    seen = Seen()
    readies = [asyncio.Event() for _ in range(watchers)]
    tasks = [
        asyncio.ensure_future(_watch(urls[i % len(urls)], api_token, run_id, seen, ready))
        for i, ready in enumerate(readies)
    ]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 120)
    await asyncio.sleep(0.5)
    # What the client holds now (its sockets) is out of the collector's way: a full collection
    # traversing it would pause the client, and every event in flight would seem late.
    gc.freeze()
    # REPEATS windows on the same servers and sockets, the median of each figure kept: one
    # five-second window's p99 is its tenth-worst frame, and on a shared two-core machine
    # that swung 2x between single runs of one build (issue 39).
    windows = []
    for window in range(REPEATS):
        windows.append(await _window(servers, runner, run_id, window, watchers, rate, seen))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await runner.ws.close()
    gc.unfreeze()
    return median_of(windows)


def median_of(windows: list[dict], tail: str = "push_p99_ms", summed: tuple = ()) -> dict:
    """Each figure's median over the windows; ``{tail}_windows`` keeps every window's tail,
    ``saturated`` holds if any window was, and the counts named in ``summed`` (frames left
    unanswered, refused) add up over the windows."""
    figures = {}
    for key, first in windows[0].items():
        values = [w[key] for w in windows]
        if key in summed:
            figures[key] = sum(values)
        elif isinstance(first, bool):
            figures[key] = any(values)
        elif isinstance(first, int) and None not in values:
            figures[key] = statistics.median_low(values)
        elif isinstance(first, float) and None not in values:
            figures[key] = round(statistics.median(values), 2)
        else:
            figures[key] = first if len(set(map(str, values))) == 1 else None
    figures["windows"] = len(windows)
    figures[f"{tail}_windows"] = [w[tail] for w in windows]
    return figures


async def _window(
    servers: list[Server], runner: Runner, run_id: str, window: int, watchers: int, rate, seen
) -> dict:
    """One window of SECONDS at ``rate``, continuing the run where the last window ended;
    figures for the events sent in it alone."""
    total = int(rate * SECONDS)
    answered: dict[int, int] = {}
    started_ns = time.perf_counter_ns()
    client = redis.Redis.from_url(REDIS_URL)
    before = _commandstats(client)
    cpu_before = [_cpu_seconds(s.proc.pid) for s in servers]
    scraped_before = [_scrape(s) for s in servers]
    first_seen = len(seen)
    sent = await pipelined(runner, run_id, rate, SECONDS, answered, first=window * total + 1)

    deadline = time.monotonic() + 30
    while len(seen) - first_seen < total * watchers and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    after = _commandstats(client)
    cpu = sum(_cpu_seconds(s.proc.pid) - c for s, c in zip(servers, cpu_before, strict=True))
    scraped_after = [_scrape(s) for s in servers]
    client.close()

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    # A straggler of an earlier window (one that timed out) is not this window's.
    arrived = [(s, now) for s, now in seen.since(first_seen) if s >= started_ns]
    delivered = len(arrived)
    latencies = [(now - sent_ns) / 1e6 for sent_ns, now in arrived]
    # From the runner's answer (the commit) to the watcher: the fan-out alone, whatever the
    # ingest backlog in front of it.
    fanout = [(now - answered[s]) / 1e6 for s, now in arrived if s in answered]
    if delivered != total * watchers:
        notes.append(f"fleet: {delivered} of {total * watchers} deliveries observed")
    # Each watcher's events over the time from the first send to the last arrival: a
    # fan-out that fell behind saturates the window as answers that did would.
    span_s = (max(n for _, n in arrived) - min(s for s, _ in arrived)) / 1e9 if arrived else 0
    delivered_per_s = delivered / watchers / span_s if span_s else 0.0
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
        "delivered_per_s": round(delivered_per_s, 1),
        "saturated": sent["saturated"] or delivered_per_s < SATURATED_BELOW * rate,
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

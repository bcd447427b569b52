"""The command engine under load: events per second it sustains from a fast agent, and the
added latency from an agent's stdout line to a live-socket subscriber (what the run page gets).

python -m bench.engines            # SQLite, one server process
python -m bench.engines postgres   # PostgreSQL + Redis (BENCH_REDIS_URL)
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import websockets

from bench.servers import REDIS_URL, Database, Server
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost

AGENT = [sys.executable, str(Path(__file__).resolve().parent / "fast_agent.py")]
BURST = 20_000
# 1,000 paced lines (20 s): the p99 of 200 was the second-worst line, and swung 2x between
# two runs of one build on one machine (issue 39).
PACED, PACE_MS = 1000, 20


def presets():
    return [
        CommandPreset.from_config({"name": "burst", "command": AGENT + ["burst", str(BURST)]}),
        CommandPreset.from_config(
            {"name": "paced", "command": AGENT + ["paced", str(PACED), str(PACE_MS)]}
        ),
    ]


async def subscribe(server: Server, api_token: str, run_id: str, on_events, ready):
    ws = await websockets.connect(
        f"{server.ws}/ws/live/",
        additional_headers={"Authorization": f"Bearer {api_token}"},
        max_size=2**24,
    )
    await ws.send(json.dumps({"type": "subscribe", "runId": run_id, "after": 0}))
    try:
        while True:
            frame = json.loads(await ws.recv())
            if frame.get("type") == "subscribed":
                ready.set()
            elif frame.get("type") == "error" and frame.get("code") == "not_found":
                # Subscribed before the run was opened (a race the subscriber can lose, and
                # then measured nothing): ask again until it exists.
                await asyncio.sleep(0.005)
                await ws.send(json.dumps({"type": "subscribe", "runId": run_id, "after": 0}))
            elif frame.get("type") == "events":
                on_events(time.monotonic_ns(), frame["events"])
    finally:
        await ws.close()


async def measure(server: Server, token: str, api_token: str) -> dict:
    workspace = tempfile.mkdtemp(prefix="canopy-bench-ws-")
    host = RunnerHost(
        f"{server.ws}/ws/runner/", token, CommandEngine(presets(), workspace), extension_id="b"
    )
    out: dict = {}
    async with host:
        # Throughput: from the run's start to its last event stored.
        started = time.perf_counter()
        ctx = await host.open_root("burst", profile="burst")
        await host.wait(ctx.run_id, timeout=600)
        elapsed = time.perf_counter() - started
        out["burst_events"] = BURST + 1
        out["burst_seconds"] = round(elapsed, 2)
        out["events_per_second"] = round((BURST + 1) / elapsed)

        # Latency: a subscriber on the live socket before the agent starts printing.
        latencies: list[float] = []

        def on_events(now, events):
            for ev in events:
                text = ev.get("text") or ""
                if text.startswith("t="):
                    latencies.append((now - int(text[2:])) / 1e6)

        run_id = f"paced-{time.time_ns()}"
        ready = asyncio.Event()
        watcher = asyncio.ensure_future(subscribe(server, api_token, run_id, on_events, ready))
        await asyncio.sleep(0)  # the subscription may precede the run: it waits for it
        ctx = await host.open_root("paced", profile="paced", run_id=run_id)
        await host.wait(ctx.run_id, timeout=120)
        await asyncio.sleep(1)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        latencies.sort()
        out["latency_samples"] = len(latencies)
        if latencies:
            out["latency_p50_ms"] = round(statistics.median(latencies), 2)
            out["latency_p90_ms"] = round(latencies[int(0.9 * (len(latencies) - 1))], 2)
            out["latency_p99_ms"] = round(latencies[int(0.99 * (len(latencies) - 1))], 2)
            out["latency_max_ms"] = round(latencies[-1], 2)
    return out


def main(kind: str = "sqlite") -> dict:
    db = Database(kind)
    try:
        token = db.runner_token("engines")
        api_token = json.loads(db.python("bench.seed", "operator"))["apiToken"]
        env = {"REDIS_URL": REDIS_URL} if kind == "postgres" else {}
        server = Server(db, **env)
        try:
            result = asyncio.run(measure(server, token, api_token))
        finally:
            server.stop()
    finally:
        db.close()
    print(json.dumps({"database": kind, **result}, indent=2))
    return result


def both() -> None:
    """``make bench``'s step: an agent's line to a live socket on each backend."""
    from bench.table import results

    for kind in ("sqlite", "postgres"):
        figures = main(kind)
        for name in ("events_per_second", "latency_p50_ms", "latency_p99_ms"):
            results[f"engines_{kind}_{name}"] = figures.get(name)


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["sqlite"]))

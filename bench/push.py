"""Push latency: a runner's event to 20 operator live sockets, on one process and across two
(PostgreSQL + Redis)."""

from __future__ import annotations

import asyncio
import json
import time

import websockets

from bench.rpc import Runner
from bench.servers import REDIS_URL, Database, Server
from bench.table import notes, results

PUSH_RATE = 200
PUSH_SECONDS = 5
PUSH_WATCHERS = 20


async def _watcher(url: str, api_token: str, run_id: str, latencies: list, ready: asyncio.Event):
    ws = await websockets.connect(
        f"{url}/ws/live/", additional_headers={"Authorization": f"Bearer {api_token}"}
    )
    await ws.send(json.dumps({"type": "subscribe", "runId": run_id, "after": 0}))
    try:
        while True:
            frame = json.loads(await ws.recv())
            if frame.get("type") == "subscribed":
                ready.set()
            if frame.get("type") != "events":
                continue
            now = time.perf_counter_ns()
            for event in frame["events"]:
                sent = event.get("text", "")
                if sent.startswith("t="):
                    latencies.append((now - int(sent[2:])) / 1e6)
    finally:
        await ws.close()


async def _push(
    runner_url: str, watcher_url: str, token: str, api_token: str
) -> tuple[list[float], float]:
    runner = await Runner.connect(runner_url, token)
    await runner.register()
    run_id = f"push-{time.time_ns()}"
    await runner.call("run.open", {"conversationId": f"c-{run_id}", "runId": run_id})
    latencies: list[float] = []
    readies = [asyncio.Event() for _ in range(PUSH_WATCHERS)]
    watchers = [
        asyncio.ensure_future(_watcher(watcher_url, api_token, run_id, latencies, ready))
        for ready in readies
    ]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 30)
    interval = 1 / PUSH_RATE
    start = time.perf_counter()
    total = PUSH_RATE * PUSH_SECONDS
    for index in range(total):
        # Paced against the clock; each frame still waits for the last one's answer, as a
        # runner's does, so answers slower than the interval lower the rate actually sent,
        # which is reported beside the latencies (a lower rate flatters them).
        delay = start + index * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        event = {"kind": "text-delta", "text": f"t={time.perf_counter_ns()}"}
        await runner.call("run.event", {"runId": run_id, "from": index + 1, "events": [event]})
    sent_per_s = total / (time.perf_counter() - start)
    if sent_per_s < 0.9 * PUSH_RATE:
        notes.append(f"push: {sent_per_s:.0f} events/s sent of {PUSH_RATE} offered")
    await asyncio.sleep(1)
    for watcher in watchers:
        watcher.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)
    await runner.ws.close()
    expected = total * PUSH_WATCHERS
    if len(latencies) != expected:
        notes.append(f"push: {len(latencies)} of {expected} deliveries observed")
    return latencies, sent_per_s


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def push():
    push_one_process()
    push_two_processes()


def push_one_process():
    db = Database("sqlite")
    try:
        token = db.runner_token("push")
        api_token = json.loads(db.python("bench.seed", "operator"))["apiToken"]
        server = Server(db)
        try:
            latencies, sent_per_s = asyncio.run(_push(server.ws, server.ws, token, api_token))
        finally:
            server.stop()
    finally:
        db.close()
    results["push_p50_ms_one_process"] = round(_percentile(latencies, 0.50), 2)
    results["push_p99_ms_one_process"] = round(_percentile(latencies, 0.99), 2)
    results["push_sent_per_s_one_process"] = round(sent_per_s, 1)


def push_two_processes():
    db = Database("postgres")
    try:
        token = db.runner_token("push")
        api_token = json.loads(db.python("bench.seed", "operator"))["apiToken"]
        a = Server(db, REDIS_URL=REDIS_URL)
        b = Server(db, REDIS_URL=REDIS_URL)
        try:
            latencies, sent_per_s = asyncio.run(_push(a.ws, b.ws, token, api_token))
        finally:
            a.stop()
            b.stop()
    finally:
        db.close()
    results["push_p50_ms_two_processes"] = round(_percentile(latencies, 0.50), 2)
    results["push_p99_ms_two_processes"] = round(_percentile(latencies, 0.99), 2)
    results["push_sent_per_s_two_processes"] = round(sent_per_s, 1)

"""child.read at both ends of a stream of a million events: the read must not slow down with
the stream's length."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

from bench.rpc import Runner
from bench.servers import Database, Server
from bench.table import results

READ_EVENTS = 1_000_000


async def _read(url: str, seed: dict) -> tuple[float, float]:
    runner = await Runner.connect(url, seed["token"])
    await runner.register(
        [{"extensionId": "bench", "generation": 1, "presets": [{"name": "worker"}]}]
    )
    params = {
        "runId": seed["runId"],
        "extensionId": "bench",
        "generation": 1,
        "childId": seed["childId"],
    }

    async def timed(after: int) -> float:
        samples = []
        for _ in range(15):
            started = time.perf_counter()
            result = await runner.call("child.read", {**params, "after": after})
            samples.append((time.perf_counter() - started) * 1000)
            assert result["events"][0]["sequence"] == after + 1
        return statistics.median(samples)

    at_start = await timed(0)
    at_end = await timed(READ_EVENTS - 128)
    await runner.ws.close()
    return at_start, at_end


def read():
    db = Database("sqlite")
    try:
        seed = json.loads(db.python("bench.seed", "big-run", "--events", str(READ_EVENTS)))
        server = Server(db)
        try:
            at_start, at_end = asyncio.run(_read(server.ws, seed))
        finally:
            server.stop()
    finally:
        db.close()
    results["read_ms_after_zero"] = round(at_start, 2)
    results["read_ms_after_end"] = round(at_end, 2)
    results["read_ratio"] = round(at_end / at_start, 3)

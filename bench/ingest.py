"""Ingest: events per second from four runners into one server on SQLite and PostgreSQL,
beside the database's own ceilings, and with usage rollups on and off."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

from bench.rpc import TEXT, Runner
from bench.servers import Database, Server
from bench.table import results

INGEST_RUNNERS = 4
# 100,000 events a round (1.5-3 s here) and the median of five rounds: rounds of 40,000 (under
# a second) and three of them put SQLite's ratio to the driver at 0.33, 0.42 and 0.50 in three
# runs of one build on one machine (issue 39).
INGEST_FRAMES = 250
INGEST_BATCH = 100
INGEST_ROUNDS = 5
# The ORM's ceiling (and PostgreSQL's 4-writer driver ceiling), the median of three; the
# driver's own ceiling is measured beside each ingest round instead.
CEILING_ROUNDS = 3


async def _race(url: str, tokens: list[str], prepare, send=None) -> float:
    """Events per second with every runner sending at once: each connects and ``prepare``s
    its run (returning the run id and a frame's events), then all send INGEST_FRAMES frames
    together, each frame waiting for the last one's answer as a runner's does. ``send(run,
    frame, events)``, if given, sends each frame instead (bench.traces: runs that end)."""

    async def one(index: int, token: str):
        runner = await Runner.connect(url, token)
        run_id, events = await prepare(index, runner)
        await ready.wait()
        for frame in range(INGEST_FRAMES):
            if send is not None:
                await send(run_id, frame, events)
                continue
            await runner.call(
                "run.event", {"runId": run_id, "from": frame * INGEST_BATCH + 1, "events": events}
            )
        await runner.ws.close()

    ready = asyncio.Event()
    tasks = [asyncio.ensure_future(one(i, t)) for i, t in enumerate(tokens)]
    await asyncio.sleep(0.5)
    started = time.perf_counter()
    ready.set()
    await asyncio.gather(*tasks)
    return len(tokens) * INGEST_FRAMES * INGEST_BATCH / (time.perf_counter() - started)


def on_off_rounds(rounds: int, round_, *, name: str, on: dict, off: dict) -> dict[str, list]:
    """Events per second of ``rounds`` rounds ``round_(url, tokens, tag)`` on each of two
    servers, one with the ``on`` settings and one with the ``off``, alternating (off first,
    then on first) so a machine slowing down over the step slows both sides of a ratio.

    Each server has a SQLite file of its own, as a deployment on SQLite is one process. On one
    shared file the idle server's upkeep (a sweep a second, the export sender's claim) took
    the write lock while the busy one committed, and each waited in SQLite's busy handler,
    which sleeps 1, 2, 5, 10 ms and on before it tries again (issue 39: the sender's claim
    spent 0.43 s of five rounds there beside an idle server, 0.02 s alone)."""
    dbs, servers = {}, {}
    try:
        for tag in ("on", "off"):
            dbs[tag] = Database("sqlite")
        tokens = {
            tag: [db.runner_token(f"{name}-{i}") for i in range(INGEST_RUNNERS)]
            for tag, db in dbs.items()
        }
        servers["on"], servers["off"] = Server(dbs["on"], **on), Server(dbs["off"], **off)
        rates = {"on": [], "off": []}
        for index in range(rounds):
            for tag in ("off", "on") if index % 2 == 0 else ("on", "off"):
                url = servers[tag].ws
                rates[tag].append(asyncio.run(round_(url, tokens[tag], f"{tag}{index}")))
    finally:
        for server in servers.values():
            server.stop()
        for db in dbs.values():
            db.close()
    return rates


async def _ingest_round(url: str, tokens: list[str], round_: int) -> float:
    async def prepare(index: int, runner: Runner):
        await runner.register()
        run_id = f"ingest-{round_}-{index}"
        await runner.call("run.open", {"conversationId": f"c-{run_id}", "runId": run_id})
        events = [{"kind": "text-delta", "text": TEXT} for _ in range(INGEST_BATCH)]
        return run_id, events

    return await _race(url, tokens, prepare)


def ingest(kind: str):
    """Each ingest round beside a round of the driver's ceiling, the ratio the median of the
    pairs' ratios: a VM's speed wanders by the minute (issue 39: one Intel VM's loop went from 90
    to 165 ms within a run), and medians of rounds minutes apart compared two speeds."""
    db = Database(kind)
    try:
        tokens = [db.runner_token(f"ingest-{i}") for i in range(INGEST_RUNNERS)]
        total = INGEST_RUNNERS * INGEST_FRAMES * INGEST_BATCH

        def rows_per_s(step: str, *args: str) -> float:
            rows = ("--rows", str(total), "--batch", str(INGEST_BATCH))
            return json.loads(db.python("bench.seed", step, *rows, *args))["rows_per_s"]

        server = Server(db)
        rates, drivers = [], []
        try:
            for round_ in range(INGEST_ROUNDS):
                rates.append(asyncio.run(_ingest_round(server.ws, tokens, round_)))
                drivers.append(rows_per_s("driver-ceiling"))
        finally:
            server.stop()
        ceiling = statistics.median(rows_per_s("ceiling") for _ in range(CEILING_ROUNDS))
        # Informative: on PostgreSQL the server commits from several connections at once.
        if kind == "postgres":
            writers = statistics.median(
                rows_per_s("driver-ceiling", "--writers", str(INGEST_RUNNERS))
                for _ in range(CEILING_ROUNDS)
            )
    finally:
        db.close()
    rate, driver = statistics.median(rates), statistics.median(drivers)
    pairs = [round(r / d, 3) for r, d in zip(rates, drivers, strict=True)]
    results[f"ingest_{kind}_events_per_s"] = round(rate)
    results[f"ingest_{kind}_ceiling_rows_per_s"] = round(ceiling)
    results[f"ingest_{kind}_ratio"] = round(rate / ceiling, 3)
    results[f"ingest_{kind}_driver_ceiling_rows_per_s"] = round(driver)
    results[f"ingest_{kind}_driver_ratio"] = statistics.median(pairs)
    results[f"ingest_{kind}_driver_ratio_rounds"] = pairs
    if kind == "postgres":
        results[f"ingest_{kind}_driver_ceiling_{INGEST_RUNNERS}_writers_rows_per_s"] = round(
            writers
        )
        results[f"ingest_{kind}_driver_ratio_{INGEST_RUNNERS}_writers"] = round(rate / writers, 3)


# --- ingest with usage rollups on and off ---------------------------------------------------

# Frames of INGEST_BATCH events, one in ROLLUP_USAGE_EVERY a usage event (an agent reports one
# per model turn), written by runs two levels down a tree, so each frame's usage goes up a
# chain of three rollup rows. The same frames go to a server with ROLLUPS_ENABLED=false (the
# setting exists for this comparison only), alternating rounds (``on_off_rounds``).
ROLLUP_EXTENSION = {"extensionId": "bench", "generation": 1, "presets": [{"name": "worker"}]}
ROLLUP_USAGE_EVERY = 20
ROLLUP_ROUNDS = 3
ROLLUP_LEVELS = 2


async def _rollup_round(url: str, tokens: list[str], tag: str) -> float:
    async def prepare(index: int, runner: Runner):
        await runner.register([ROLLUP_EXTENSION])
        root = f"rollup-{tag}-{index}"
        await runner.call("run.open", {"conversationId": f"c-{root}", "runId": root})
        run_id = root
        for level in range(ROLLUP_LEVELS):
            child = await runner.call(
                "child.start",
                {
                    "runId": run_id,
                    "extensionId": "bench",
                    "generation": 1,
                    "request": {"requestId": f"r{level}", "profile": "worker", "message": "go"},
                },
            )
            run_id = child["runId"]
        events = [
            {
                "kind": "usage",
                "text": "tokens",
                "input": {
                    "inputTokens": 1200,
                    "outputTokens": 300,
                    "cacheReadTokens": 900,
                    "costUsd": 0.0081,
                    "model": "bench",
                },
            }
            if i % ROLLUP_USAGE_EVERY == ROLLUP_USAGE_EVERY - 1
            else {"kind": "text-delta", "text": TEXT}
            for i in range(INGEST_BATCH)
        ]
        return run_id, events

    return await _race(url, tokens, prepare)


def ingest_rollups():
    rates = on_off_rounds(
        ROLLUP_ROUNDS, _rollup_round, name="rollup", on={}, off={"ROLLUPS_ENABLED": "false"}
    )
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    results["ingest_sqlite_rollup_events_per_s"] = round(on)
    results["ingest_sqlite_no_rollup_events_per_s"] = round(off)
    results["ingest_sqlite_rollup_ratio"] = round(on / off, 3)

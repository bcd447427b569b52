"""Budget stop and cancel delivery (issue 20): how much cost a server accepts after a budget is
crossed (the overshoot), and how long a stop's ``run.cancel`` takes to reach the runner, with
Redis up and with Redis down.

Two server processes on PostgreSQL share a private ``redis-server`` (stopped for the "down"
figures, so the machine's shared one is never touched). A runner on A grows a 7-run tree under
a ``maxCostUsd`` budget and streams frames of 50 events, every tenth a usage event, as fast as
they are answered, until its ``run.cancel`` arrives: the overshoot is the cost of the frames
answered after the one that crossed, as a share of the budget. An operator's cancel through
B's REST API of a tree on A gives the cross-process delivery.

``python -m bench stop`` (part of ``make bench``'s table).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time

from bench.rpc import TEXT, Runner
from bench.servers import Database, Server
from bench.table import notes, results

BUDGET_USD = 20.0
FRAME_EVENTS = 50
USAGE_EVERY = 10
USAGE_COST = 0.05  # USD: a frame costs 0.25, so the budget is crossed at the 80th frame
CHILDREN = 6
ROUNDS = 3
GIVE_UP = 15.0  # seconds after the crossing without a run.cancel: reported as such
EXTENSION = {"extensionId": "bench", "generation": 1, "presets": [{"name": "worker"}]}


class CommandRunner(Runner):
    """The bench runner, noting when each server command arrived (it still accepts them)."""

    def __init__(self, ws):
        super().__init__(ws)
        self.arrived: list[tuple[float, str, dict]] = []

    async def call(self, method: str, params: dict) -> dict:
        rpc_id = next(self.ids)
        await self.ws.send(
            json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
        )
        return await self.answer(rpc_id, method)

    async def answer(self, rpc_id, method: str = "") -> dict:
        while True:
            frame = await self._next()
            if frame is not None and frame.get("id") == rpc_id:
                if "error" in frame:
                    raise RuntimeError(f"{method}: {frame['error']}")
                return frame["result"]

    async def _next(self) -> dict | None:
        """The next frame; a server command is noted and accepted instead (None)."""
        frame = json.loads(await self.ws.recv())
        if "method" not in frame:
            return frame
        self.arrived.append((time.perf_counter(), frame["method"], frame["params"]))
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": frame["id"], "result": {}}))
        return None

    def cancelled(self, run_ids: set[str]) -> float | None:
        times = [
            at for at, name, p in self.arrived if name == "run.cancel" and p["runId"] in run_ids
        ]
        return min(times) if times else None

    async def wait_cancel(self, run_ids: set[str], timeout: float) -> float | None:
        """Read (and accept) commands until a run.cancel for one of ``run_ids`` is in."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.cancelled(run_ids) is None:
                    await self._next()
        return self.cancelled(run_ids)


def _frame() -> list[dict]:
    usage = {"inputTokens": 1200, "outputTokens": 300, "costUsd": USAGE_COST, "model": "bench"}
    return [
        {"kind": "usage", "text": "tokens", "input": usage}
        if i % USAGE_EVERY == USAGE_EVERY - 1
        else {"kind": "text-delta", "text": TEXT}
        for i in range(FRAME_EVENTS)
    ]


async def _tree(runner: CommandRunner, root: str, budget: dict | None) -> list[str]:
    params = {"conversationId": f"c-{root}", "runId": root}
    if budget is not None:
        params["budget"] = budget
    await runner.call("run.open", params)
    runs = []
    for n in range(CHILDREN):
        request = {"requestId": f"{root}-{n}", "profile": "worker", "message": "go"}
        child = await runner.call(
            "child.start",
            {"runId": root, "extensionId": "bench", "generation": 1, "request": request},
        )
        runs.append(child["runId"])
    return [root, *runs]


async def _overshoot(runner: CommandRunner, root: str) -> tuple[float, float | None]:
    """(cost accepted after the crossing as a share of the budget, seconds from the crossing
    frame's answer to the run.cancel)."""
    runs = await _tree(runner, root, {"maxCostUsd": BUDGET_USD})
    frame, emitted = _frame(), {run_id: 0 for run_id in runs[1:]}
    frame_cost = USAGE_COST * FRAME_EVENTS / USAGE_EVERY
    cost, crossed_at, after = 0.0, None, 0.0
    for index in range(10**6):
        run_id = runs[1 + index % CHILDREN]
        await runner.call(
            "run.event", {"runId": run_id, "from": emitted[run_id] + 1, "events": frame}
        )
        emitted[run_id] += FRAME_EVENTS
        if crossed_at is not None:
            after += frame_cost
        cost += frame_cost
        if crossed_at is None and cost >= BUDGET_USD - 1e-9:
            crossed_at = time.perf_counter()
        # A runner stops writing to a run once it is told to cancel it.
        arrived = runner.cancelled(set(runs))
        if arrived is not None or (crossed_at and time.perf_counter() - crossed_at > GIVE_UP):
            break
    delivery = None if arrived is None else max(0.0, arrived - crossed_at)
    return after / BUDGET_USD, delivery


async def _operator_cancel(runner: CommandRunner, b: Server, api_token: str, root: str):
    """Seconds from B's answer to an operator's cancel to the run.cancel on A's socket."""
    import urllib.request

    runs = await _tree(runner, root, None)
    request = urllib.request.Request(
        f"{b.http}/api/runs/{root}/cancel",
        data=json.dumps({"reason": "bench", "cascade": True}).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {api_token}", "Content-Type": "application/json"},
    )
    await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=15).read())
    answered = time.perf_counter()
    arrived = await runner.wait_cancel(set(runs), GIVE_UP)
    return None if arrived is None else max(0.0, arrived - answered)


async def _measure(a: Server, b: Server, token: str, api_token: str, redis, tag: str) -> dict:
    """ROUNDS budget stops and operator cancels; with ``tag`` "down", Redis is stopped once
    the runner has registered (a registration needs it) and started again at the end."""
    runner = await CommandRunner.connect(a.ws, token)
    await runner.register([EXTENSION])
    if tag == "down":
        await asyncio.to_thread(redis.stop, True)
    out = {}
    try:
        overshoots, deliveries, operator = [], [], []
        for round_ in range(ROUNDS):
            share, seconds = await _overshoot(runner, f"stop-{tag}-{round_}")
            overshoots.append(share)
            deliveries.append(seconds)
            operator.append(await _operator_cancel(runner, b, api_token, f"op-{tag}-{round_}"))
        for name, values in (("budget_stop", deliveries), ("operator_cancel", operator)):
            missing = sum(v is None for v in values)
            if missing:
                notes.append(f"stop: {missing} {name} cancel(s) not in after {GIVE_UP}s ({tag})")
            got = [v for v in values if v is not None] or [GIVE_UP]
            out[f"{name}_delivery_ms_redis_{tag}"] = round(statistics.median(got) * 1000, 1)
        out[f"budget_overshoot_pct_redis_{tag}"] = round(statistics.median(overshoots) * 100, 1)
    finally:
        await runner.ws.close()
        if tag == "down":
            await asyncio.to_thread(redis.start)
    return out


def stop():
    from tests.support.fault_tools import RedisServer

    db = Database("postgres")
    redis = RedisServer().start()
    servers = []
    try:
        token = db.runner_token("stop")
        api_token = json.loads(db.python("bench.seed", "operator"))["apiToken"]
        servers.append(Server(db, REDIS_URL=redis.url))
        servers.append(Server(db, REDIS_URL=redis.url))
        for tag in ("up", "down"):
            results.update(asyncio.run(_measure(*servers, token, api_token, redis, tag)))
    finally:
        for server in servers:
            server.stop()
        redis.close()
        db.close()

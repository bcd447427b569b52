"""Memory: one server process holding 1,000 idle live sockets."""

from __future__ import annotations

import asyncio
import json

import websockets

from bench.rpc import Runner
from bench.servers import Database, Server
from bench.table import results

IDLE_SOCKETS = 1000


async def _hold_sockets(server: Server, api_token: str, run_id: str) -> float:
    sockets = []
    for _ in range(IDLE_SOCKETS):
        ws = await websockets.connect(
            f"{server.ws}/ws/live/", additional_headers={"Authorization": f"Bearer {api_token}"}
        )
        await ws.send(json.dumps({"type": "subscribe", "runId": run_id, "after": 0}))
        sockets.append(ws)
    for ws in sockets:  # every socket has been served its subscription
        while json.loads(await ws.recv()).get("type") != "subscribed":
            pass
    await asyncio.sleep(2)
    rss = server.rss_mb()
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return rss


async def _open_run(url: str, token: str) -> str:
    runner = await Runner.connect(url, token)
    await runner.register()
    await runner.call("run.open", {"conversationId": "c-idle", "runId": "idle"})
    await runner.ws.close()
    return "idle"


def memory():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    db = Database("sqlite")
    try:
        token = db.runner_token("idle")
        api_token = json.loads(db.python("bench.seed", "operator"))["apiToken"]
        # One bench account holds every socket: lift the per-user cap (20) that would
        # otherwise close all but the first twenty with 4429.
        server = Server(db, LIVE_MAX_SOCKETS_PER_USER=str(IDLE_SOCKETS))
        try:
            run_id = asyncio.run(_open_run(server.ws, token))
            results["memory_mb_idle_server"] = round(server.rss_mb(), 1)
            results["memory_mb_1000_sockets"] = round(
                asyncio.run(_hold_sockets(server, api_token, run_id)), 1
            )
        finally:
            server.stop()
    finally:
        db.close()

"""MCP measures (issue 10): ``delegate`` round trip through /mcp next to ``child.start`` over
the runner socket on the same server and parent, and the server's memory and database
connections while 50 ``read_child`` calls wait.

``python -m bench mcp`` (part of ``make bench``'s table) or ``python -m bench.mcp``.
"""

from __future__ import annotations

import asyncio
import time

from bench.servers import Database, Server
from delegation.client import Extension, Preset, RunnerClient

ROUNDS = 200
WAITERS = 50


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _measure(server: Server, token: str) -> dict:
    from tests.support.mcp_tools import mcp_session

    client = RunnerClient(
        server.ws + "/ws/runner/",
        token,
        extensions=[Extension("ext", 1, [Preset("worker", "You work.")])],
        depth=None,
    )
    client.on("child.execute", _ack)
    await client.connect()
    try:
        await client.open_run("c-bench", "bench-root", extension_id="ext")
        issued = await client.call("run.mcpToken", {"runId": "bench-root"})
        mcp_ms, socket_ms = [], []
        async with mcp_session(issued["url"], issued["token"]) as mcp:
            for i in range(20):  # warm both paths
                await mcp.call_tool("delegate", {"profile": "worker", "message": f"warm {i}"})
                await client.child_start(
                    "bench-root",
                    "ext",
                    1,
                    {"requestId": f"w-{i}", "profile": "worker", "message": "w"},
                )
            for i in range(ROUNDS):
                started = time.perf_counter()
                answer = await mcp.call_tool(
                    "delegate", {"profile": "worker", "message": f"task {i}", "requestId": f"m-{i}"}
                )
                mcp_ms.append((time.perf_counter() - started) * 1000)
                assert not answer.is_error, answer
                started = time.perf_counter()
                await client.child_start(
                    "bench-root",
                    "ext",
                    1,
                    {"requestId": f"s-{i}", "profile": "worker", "message": f"task {i}"},
                )
                socket_ms.append((time.perf_counter() - started) * 1000)
            child = answer.structured_content["conversationId"]
            rss_before = server.rss_mb()
            waiting: set[int] = set()

            def progress(index):
                async def on_progress(value, total, message):
                    waiting.add(index)

                return on_progress

            reads = [
                asyncio.ensure_future(
                    mcp.call_tool(
                        "read_child",
                        {"childId": child, "waitSeconds": 30},
                        progress_callback=progress(i),
                    )
                )
                for i in range(WAITERS)
            ]
            while len(waiting) < WAITERS:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1)
            rss_waiting = server.rss_mb()
            await client.emit(answer.structured_content["runId"], {"kind": "text", "text": "go"})
            await asyncio.gather(*reads)
        return {
            "mcp_delegate_p50_ms": _percentile(mcp_ms, 0.5),
            "mcp_delegate_p99_ms": _percentile(mcp_ms, 0.99),
            "socket_child_start_p50_ms": _percentile(socket_ms, 0.5),
            "socket_child_start_p99_ms": _percentile(socket_ms, 0.99),
            "mcp_rss_mb_before_50_waits": rss_before,
            "mcp_rss_mb_50_waiting_reads": rss_waiting,
        }
    finally:
        await client.close()


async def _ack(params, client):
    return {}


def measure(kind: str = "sqlite") -> dict:
    db = Database(kind)
    try:
        token = db.runner_token("bench-mcp")
        # No caps in the way of 440 children under one parent; nothing else differs.
        server = Server(db, DELEGATION_MAX_CHILDREN="100000", DELEGATION_MAX_CONCURRENT="100000")
        try:
            return asyncio.run(_measure(server, token))
        finally:
            server.stop()
    finally:
        db.close()


if __name__ == "__main__":
    for key, value in measure().items():
        print(f"{key:32} {value:10.1f}")

"""Approvals measures (issue 22): the time from an operator's decision (the REST POST, what
the inbox's click sends) to the agent's ``approve`` call answering (when its tool runs),
p50/p99 over 50 approvals, on one server process and on two (MCP on one, REST on the other,
PostgreSQL + Redis); and the server's memory while 200 approvals wait.

``python -m bench.approvals`` (or ``python -m bench approvals``).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from bench.servers import Database, Server
from delegation.client import Extension, Preset, RunnerClient

ROUNDS = 50
WAITERS = 200


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _pending(http, count: int) -> list[dict]:
    while True:
        page = (await http.get("/api/approvals", params={"status": "pending", "limit": 500})).json()
        if len(page["items"]) >= count:
            return page["items"]
        await asyncio.sleep(0.05)


async def _measure(mcp_server: Server, rest_server: Server, token: str, api: str, tag: str):
    from tests.support.mcp_tools import mcp_session

    client = RunnerClient(
        mcp_server.ws + "/ws/runner/",
        token,
        extensions=[Extension("ext", 1, [Preset("worker", "You work.")])],
        depth=None,
    )
    await client.connect()
    out = {}
    headers = {"Authorization": f"Bearer {api}"}
    try:
        await client.open_run(f"c-{tag}", f"ap-{tag}", extension_id="ext")
        issued = await client.call("run.mcpToken", {"runId": f"ap-{tag}"})
        async with (
            mcp_session(issued["url"], issued["token"]) as mcp,
            httpx.AsyncClient(base_url=rest_server.http, headers=headers, timeout=60) as http,
        ):
            latencies = []
            for i in range(ROUNDS):
                call = asyncio.ensure_future(
                    mcp.call_tool("approve", {"tool_name": "Bash", "input": {"command": f"t{i}"}})
                )
                (item,) = await _pending(http, 1)
                started = time.perf_counter()
                url = f"/api/approvals/{item['approvalId']}/decision"
                decided = await http.post(url, json={"decision": "allow"})
                assert decided.status_code == 200, decided.text
                answer = await call
                latencies.append((time.perf_counter() - started) * 1000)
                assert json.loads(answer.content[0].text)["behavior"] == "allow"
            out[f"approval_click_to_tool_p50_ms_{tag}"] = _percentile(latencies, 0.5)
            out[f"approval_click_to_tool_p99_ms_{tag}"] = _percentile(latencies, 0.99)
        if tag == "one":
            out.update(await _memory(mcp_server, issued, headers))
    finally:
        await client.close()
    return out


async def _memory(server: Server, issued: dict, headers: dict) -> dict:
    """RSS while WAITERS approve calls wait, over several MCP sessions (one HTTP client's
    connection pool holds 100 requests; the rest would queue in the client, not wait here)."""
    import contextlib

    from tests.support.mcp_tools import mcp_session

    rss_before = server.rss_mb()
    async with (
        contextlib.AsyncExitStack() as stack,
        httpx.AsyncClient(base_url=server.http, headers=headers, timeout=60) as http,
    ):
        sessions = [
            await stack.enter_async_context(mcp_session(issued["url"], issued["token"]))
            for _ in range(WAITERS // 40)
        ]
        calls = [
            asyncio.ensure_future(
                sessions[i % len(sessions)].call_tool(
                    "approve", {"tool_name": "Edit", "input": {"n": i}}
                )
            )
            for i in range(WAITERS)
        ]
        items = await _pending(http, WAITERS)
        await asyncio.sleep(1)
        rss_waiting = server.rss_mb()
        for item in items:
            await http.post(
                f"/api/approvals/{item['approvalId']}/decision", json={"decision": "deny"}
            )
        await asyncio.gather(*calls)
    return {"approval_rss_mb_before": rss_before, "approval_rss_mb_200_pending": rss_waiting}


def measure() -> dict:
    from tests.support.fault_tools import RedisServer

    results = {}
    db = Database("sqlite")
    try:
        token = db.runner_token("bench-approvals")
        api = json.loads(db.python("bench.seed", "operator"))["apiToken"]
        server = Server(db)
        try:
            results.update(asyncio.run(_measure(server, server, token, api, "one")))
        finally:
            server.stop()
    finally:
        db.close()
    db = Database("postgres")
    redis = RedisServer().start()
    servers = []
    try:
        token = db.runner_token("bench-approvals")
        api = json.loads(db.python("bench.seed", "operator"))["apiToken"]
        servers = [Server(db, REDIS_URL=redis.url), Server(db, REDIS_URL=redis.url)]
        results.update(asyncio.run(_measure(*servers, token, api, "two")))
    finally:
        for server in servers:
            server.stop()
        redis.close()
        db.close()
    return results


if __name__ == "__main__":
    for key, value in measure().items():
        print(f"{key:40} {value:10.1f}")

"""Canopy behind nginx (issue 26 §3): the site config shipped in ``deploy/nginx/`` in front of
real daphne processes (two on PostgreSQL + Redis, where doorbells cross processes; one on the
SQLite pass), and every door through it: a page and a static file, a runner socket, a live
socket, ``/mcp`` with a waiting ``read_child``, and the body limits the proxy enforces."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from delegation.client import event
from tests.support.mcp_tools import LiveRunner, mcp_session
from tests.support.nginx import nginx_factory  # noqa: F401  (a fixture)
from tests.support.tcp_clients import make_runner, stored_events

pytestmark = [
    pytest.mark.usefixtures("close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


def _processes() -> int:
    # Without Redis, two processes share no doorbells: a waiting read would wait it out.
    return 2 if settings.REDIS_URL else 1


def _get(url: str, data: bytes | None = None, headers=None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.fixture
def fleet(daphne_factory, nginx_factory):  # noqa: F811
    servers = [daphne_factory(LIVE_HEARTBEAT_SECONDS=60) for _ in range(_processes())]
    return nginx_factory(servers), servers


async def test_it_carries_pages_static_runner_live_and_waiting_mcp_traffic_through_nginx(
    fleet, live_clients, operator_token
):
    proxy, _servers = fleet
    await asyncio.to_thread(_pages_and_limits, proxy)
    token = await sync_to_async(make_runner)("nginx-runner")
    async with LiveRunner(proxy, token) as runner:
        await runner.open("root-ng")
        issued = await runner.run_token("root-ng")
        # The runner's Host went through: the MCP address it is handed is the proxy's.
        assert issued["url"] == proxy.http_url + "/mcp", issued
        watchers = [await live_clients(proxy.live_url, operator_token) for _ in range(4)]
        for watcher in watchers:
            await watcher.subscribe("root-ng")
        async with mcp_session(issued["url"], issued["token"]) as mcp:
            child = await mcp.call_tool("delegate", {"profile": "worker", "message": "x"})
            child_id = child.structured_content["conversationId"]
            run_id = child.structured_content["runId"]
            await runner.wait_command("child.execute", run_id)
            progress = []

            async def on_progress(value, total, message):
                progress.append(value)

            reading = asyncio.ensure_future(
                mcp.call_tool(
                    "read_child",
                    {"childId": child_id, "waitSeconds": 30},
                    progress_callback=on_progress,
                )
            )
            async with asyncio.timeout(10):
                while not progress:  # the waiting answer's progress came through unbuffered
                    await asyncio.sleep(0.01)
            await runner.client.emit(run_id, event("text", text="first"))
            async with asyncio.timeout(10):  # far inside waitSeconds: the doorbell answered
                result = await reading
        assert [e["text"] for e in result.structured_content["events"]] == ["first"]
        await runner.client.emit("root-ng", *[event("text", text=f"line {i}") for i in range(20)])
        head = (await sync_to_async(stored_events)("root-ng"))[-1]["sequence"]
        for watcher in watchers:
            await watcher.wait_until(lambda w=watcher: w.last_sequence("root-ng") >= head, 10)
            assert watcher.sequences("root-ng") == list(range(1, head + 1))
            texts = [e.get("text") for e in watcher.events("root-ng") if e["kind"] == "text"]
            assert texts == [f"line {i}" for i in range(20)]


def _pages_and_limits(proxy):
    status, _headers, body = _get(proxy.http_url + "/login/")
    assert status == 200 and b"<form" in body
    status, headers, body = _get(proxy.http_url + "/static/canopy/live.js")
    assert status == 200 and headers["Content-Type"].startswith("application/javascript"), headers
    assert headers.get("Server", "").startswith("nginx") and b"WebSocket" in body
    # Over the proxy's limits: answered by nginx, never sent upstream.
    status, headers, _ = _get(proxy.http_url + "/api/runs", data=b"x" * (4 * 1024 * 1024 + 1))
    assert status == 413 and headers.get("Server", "").startswith("nginx")
    status, headers, _ = _get(proxy.http_url + "/mcp", data=b"x" * (2 * 1024 * 1024 + 1))
    assert status == 413 and headers.get("Server", "").startswith("nginx")

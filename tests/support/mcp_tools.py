"""Helpers for the MCP tests: a runner on a live daphne, run tokens, and the official client."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from delegation.client import Extension, Preset, RunnerClient

EXTENSION = Extension(
    "ext",
    1,
    [Preset("worker", system_prompt="You work."), Preset("reviewer", system_prompt="Review.")],
)


class LiveRunner:
    """A runner (the SDK) on a live server that records every command it is sent."""

    def __init__(self, server, token: str, **kw):
        self.server = server
        self.commands: list[tuple[str, dict]] = []
        self.client = RunnerClient(server.ws_url, token, extensions=[EXTENSION], depth=None, **kw)
        for method in ("child.execute", "run.execute", "run.cancel", "run.steer"):
            self.client.on(method, self._recorder(method))

    def _recorder(self, method):
        async def handle(params, client):
            self.commands.append((method, dict(params)))
            if method == "run.steer":
                return {"outcome": "injected"}
            return {}

        return handle

    async def __aenter__(self) -> LiveRunner:
        await self.client.connect()
        return self

    async def __aexit__(self, *exc):
        await self.client.close()

    async def open(self, run_id: str, **kw):
        return await self.client.open_run(f"conv-{run_id}", run_id, extension_id="ext", **kw)

    async def run_token(self, run_id: str) -> dict:
        return await self.client.call("run.mcpToken", {"runId": run_id})

    async def wait_command(self, method: str, run_id: str, timeout: float = 10) -> dict:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for seen, params in self.commands:
                if seen == method and params.get("identity", {}).get("runId") == run_id:
                    return params
            await asyncio.sleep(0.02)
        raise AssertionError(f"no {method} for {run_id}; got {self.commands}")


@contextlib.asynccontextmanager
async def mcp_session(url: str, token: str | None, **headers: str) -> AsyncIterator[ClientSession]:
    """The official MCP client over streamable HTTP, with the run token as bearer."""
    sent = {key.replace("_", "-"): value for key, value in headers.items()}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    async with (
        create_mcp_http_client(headers=sent) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def post_status(url: str, token: str | None) -> int:
    """The HTTP status of a bare MCP initialize POST (no SDK), for 401 checks."""
    headers = {"Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(url, json=body, headers=headers)
        return response.status_code


def server_db_connections(server) -> int:
    """Database connections the daphne process itself holds right now."""
    from django.db import connection

    pid = server.process.pid
    fds = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            fds.append(os.readlink(fd))
    if connection.vendor == "postgresql":
        # Its TCP sockets whose far end is the PostgreSQL port.
        port = int(connection.settings_dict.get("PORT") or 5432)
        inodes = {link[len("socket:[") : -1] for link in fds if link.startswith("socket:[")}
        held = 0
        for table in ("tcp", "tcp6"):
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            for line in lines:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[9] in inodes and remote_port == port and fields[3] == "01":
                    held += 1
        return held
    # SQLite: every connection keeps the database file open in the process.
    database = os.path.realpath(connection.settings_dict["NAME"])
    return sum(1 for link in fds if link == database)


async def waiting_calls(mcp, tool: str, arguments: dict, n: int = 50, timeout: float = 30):
    """``n`` concurrent calls of ``tool``, returned once every one has sent a progress
    notification (so each is waiting on the server, not queued on the way to it)."""
    waiting: set[int] = set()

    def progress_of(index):
        async def on_progress(value, total, message):
            waiting.add(index)

        return on_progress

    calls = [
        asyncio.ensure_future(mcp.call_tool(tool, arguments, progress_callback=progress_of(index)))
        for index in range(n)
    ]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(waiting) < n and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert len(waiting) == n, f"only {len(waiting)} of {n} {tool} calls are waiting"
    return calls


async def connections_held(server, samples: int = 5) -> list[int]:
    """The server's database connections, sampled ``samples`` times 0.2 s apart."""
    from asgiref.sync import sync_to_async

    held = []
    for _ in range(samples):
        held.append(await sync_to_async(server_db_connections)(server))
        await asyncio.sleep(0.2)
    return held

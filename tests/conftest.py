"""Shared fixtures: personas, runner tokens, and a JSON-RPC runner over a real WebSocket."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from delegation import services


def pytest_configure(config):
    # The in-process sweep would race the tests' own explicit sweeps and DB teardown.
    settings.UPKEEP_IN_PROCESS = False
    # Persistent connections held by async-to-sync worker threads would block dropping the
    # PostgreSQL test database at the end of the session.
    settings.DATABASES["default"]["CONN_MAX_AGE"] = 0


class RpcClient:
    """A runner speaking JSON-RPC over a real WebSocket into the ASGI application."""

    def __init__(self, communicator: WebsocketCommunicator):
        self.ws = communicator
        self.ids = itertools.count(1)
        self.commands: list[dict] = []  # server-to-runner requests seen so far
        self.answer_commands = True

    async def connect(self):
        connected, code = await self.ws.connect(timeout=10)
        return connected, code

    async def send_raw(self, text: str):
        await self.ws.send_to(text_data=text)

    async def receive(self, timeout: float = 10) -> dict:
        return json.loads(await self.ws.receive_from(timeout=timeout))

    async def _note_command(self, frame: dict):
        self.commands.append(frame)
        if self.answer_commands:
            result = {"outcome": "injected"} if frame["method"] == "run.steer" else {}
            await self.ws.send_to(
                text_data=json.dumps({"jsonrpc": "2.0", "id": frame["id"], "result": result})
            )

    async def reply_to(self, rpc_id, timeout: float = 10) -> dict:
        """The next response with ``rpc_id``, recording server commands on the way."""
        while True:
            frame = await self.receive(timeout)
            if "method" in frame:
                await self._note_command(frame)
                continue
            if frame.get("id") == rpc_id:
                return frame

    async def raw_call(self, text: str, rpc_id) -> dict:
        await self.send_raw(text)
        return await self.reply_to(rpc_id)

    async def call(self, method: str, params=None, **kw) -> dict:
        rpc_id = next(self.ids)
        frame = {"jsonrpc": "2.0", "id": rpc_id, "method": method}
        if params is not None:
            frame["params"] = params
        await self.send_raw(json.dumps(frame))
        return await self.reply_to(rpc_id, **kw)

    async def ok(self, method: str, params=None) -> dict:
        frame = await self.call(method, params)
        assert "result" in frame, frame
        return frame["result"]

    async def error(self, method: str, params=None) -> dict:
        frame = await self.call(method, params)
        assert "error" in frame, frame
        return frame["error"]

    async def wait_command(self, method: str, timeout: float = 5, **match) -> dict:
        """Wait until the server has sent a command of ``method`` whose params match."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for frame in self.commands:
                params = frame["params"]
                if frame["method"] == method and all(params.get(k) == v for k, v in match.items()):
                    return frame
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no {method} {match} in {self.commands}")
            try:
                frame = await self.receive(timeout=remaining)
            except TimeoutError:
                continue
            if "method" in frame:
                await self._note_command(frame)

    async def close(self):
        await self.ws.disconnect()

    # --- conveniences ---------------------------------------------------------------------

    async def register(self, extensions=None, host="host-1", workspace=None) -> dict:
        params = {"hostInstanceId": host, "extensions": extensions or [DEFAULT_EXTENSION]}
        if workspace is not None:
            params["workspace"] = workspace
        return await self.ok("runner.register", params)

    async def open(self, run_id="root-1", conversation_id=None, **extra) -> dict:
        params = {"conversationId": conversation_id or f"conv-{run_id}", "runId": run_id}
        params.update(extra)
        return await self.ok("run.open", params)

    def child_params(self, run_id="root-1", request_id="req-1", profile="worker", **req):
        request = {"requestId": request_id, "profile": profile, "message": "do the thing"}
        request.update(req)
        return {"runId": run_id, "extensionId": "ext", "generation": 1, "request": request}


DEFAULT_EXTENSION = {
    "extensionId": "ext",
    "generation": 1,
    "presets": [
        {"name": "worker", "systemPrompt": "You work."},
        {"name": "reviewer", "options": {"maxTokens": 1000, "allowedTools": ["read", "grep"]}},
    ],
}


def application():
    from dashboard.asgi import application as app

    return app


def communicator(token: str | None, depth: str | None = None) -> WebsocketCommunicator:
    headers = []
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    if depth is not None:
        headers.append((b"x-pando-delegation-depth", depth.encode()))
    return WebsocketCommunicator(application(), "/ws/runner/", headers=headers)


@pytest.fixture
def runner_token(db):
    _runner, token = services.create_runner("runner-a")
    return token


@pytest.fixture
def make_client():
    """Open runner connections; each is closed at the end of the test."""
    opened: list[RpcClient] = []

    async def make(token: str | None, depth: str | None = None, register=True, **kw):
        client = RpcClient(communicator(token, depth))
        connected, _ = await client.connect()
        assert connected
        opened.append(client)
        if register and token is not None:
            await client.register(**kw)
        return client

    yield make
    for client in opened:
        try:
            asyncio.get_event_loop().run_until_complete(client.close())
        except Exception:
            pass


@pytest.fixture
async def runner(runner_token, make_client):
    return await make_client(runner_token)


async def create_runner_async(name: str) -> str:
    _runner, token = await database_sync_to_async(services.create_runner)(name)
    return token

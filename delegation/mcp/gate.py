"""The ASGI door of ``/mcp``: routing, the run-token check before the SDK sees the request,
and the lifespan of the SDK's session manager (stateless streamable HTTP)."""

from __future__ import annotations

import asyncio
import json

from channels.db import database_sync_to_async
from mcp.server.transport_security import TransportSecuritySettings

from delegation import upkeep
from delegation.errors import PARSE_ERROR, RpcError
from delegation.mcp.tools import build_server
from delegation.protocol import bearer_token
from delegation.services import run_tokens
from delegation.services.run_tokens import MCP_PATH
from delegation.wire import loads_strict


class McpGate:
    """Routes ``/mcp`` to the MCP SDK and everything else to ``app``; handles ASGI lifespan.

    Channels' ``ProtocolTypeRouter`` refuses lifespan, and the SDK's session manager must be
    running before it serves a request. A server that sends lifespan (uvicorn) starts and
    stops it here; daphne sends none, so the first ``/mcp`` request starts it.
    """

    def __init__(self, app):
        self.app = app
        self.server = build_server()
        self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            # The bearer run token is the protection; Host/Origin are Django's business
            # (ALLOWED_HOSTS) for the pages, and agents send no Origin.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.manager = self.server.session_manager
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "http" and scope["path"].rstrip("/") == MCP_PATH:
            await self._mcp(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._start()
                except Exception as exc:  # pragma: no cover - reported to the server
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self):
        if self._ready is None:
            self._ready = asyncio.Event()
            self._stop = asyncio.Event()
            self._task = asyncio.ensure_future(self._serve())
        await self._ready.wait()

    async def _serve(self):
        async with self.manager.run():
            self._ready.set()
            await self._stop.wait()

    async def _shutdown(self):
        if self._stop is not None and self._task is not None:
            self._stop.set()
            await self._task

    async def _mcp(self, scope, receive, send):
        if scope["method"] != "POST":
            # Stateless: no stream for the server to push on (GET) and no session to end
            # (DELETE). Answered at once, before any token is looked up.
            await _answer(send, 405, "only POST is served: the server is stateless", ALLOW)
            return
        upkeep.ensure_started()
        token = bearer_token(scope.get("headers", []))
        caller = await database_sync_to_async(run_tokens.authenticate_run_token)(token or "")
        if caller is None:
            await _unauthorized(send)
            return
        body = await _read_body(receive)
        refusal = envelope_refusal(body)
        if refusal is not None:
            await _answer_parse_error(send, refusal)
            return
        await self._start()
        await self.manager.handle_request(scope, _replay(body, receive), send)


async def _read_body(receive) -> bytes:
    """The whole request body (``BodyLimit`` has bounded it to ``MCP_MAX_BODY_BYTES``)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive):
    """A ``receive`` that hands the SDK the body already read, then the connection's own."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def envelope_refusal(body: bytes) -> str | None:
    """Why an MCP request envelope is refused before the SDK reads it, or None: decoded as
    strictly as a runner frame (SPEC §4: no duplicate keys, no NaN, no trailing data), since
    the SDK's own parser keeps the last of two duplicate keys and an intermediary may keep
    the first."""
    try:
        loads_strict(body)
    except RpcError as exc:
        return exc.message
    return None


async def _answer_parse_error(send, message: str) -> None:
    error = {"code": PARSE_ERROR, "message": message}
    await _send_json(send, 400, {"jsonrpc": "2.0", "id": None, "error": error}, [])


ALLOW = [(b"allow", b"POST")]
UNAUTHORIZED = [(b"www-authenticate", b'Bearer realm="canopy-mcp"')]


async def _unauthorized(send):
    message = "a live run token is required: Authorization: Bearer <run token>"
    await _answer(send, 401, message, UNAUTHORIZED)


async def _answer(send, status: int, message: str, headers: list) -> None:
    await _send_json(send, status, {"error": {"code": status, "message": message}}, headers)


async def _send_json(send, status: int, payload: dict, headers: list) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                *headers,
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

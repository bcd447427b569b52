"""kodelet's extension wire: LSP-style ``Content-Length`` frames, JSON-RPC 2.0 both ways.

A :class:`Peer` sends requests and notifications, answers the other side's requests with the
handlers it was given, and fails every pending call when the stream ends (an extension that
died must not leave a tool call waiting forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

log = logging.getLogger("canopy.runner.kodelet")

# Far above any tool result kodelet-subagent sends; a bigger frame is a broken peer.
MAX_FRAME = 64 * 1024 * 1024

Handler = Callable[[Any], Awaitable[Any]]


class PeerError(Exception):
    """A JSON-RPC error answer (or the peer gone: code 0)."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class HostMethodError(PeerError):
    """Raised by a host handler to answer the extension with this code and message."""


async def read_frame(reader: asyncio.StreamReader) -> dict | None:
    """One message, or ``None`` at the end of the stream."""
    length = None
    while True:
        line = await reader.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            break
        name, _, value = line.decode("ascii", "replace").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length is None or length < 0 or length > MAX_FRAME:
        raise ValueError(f"bad Content-Length frame header ({length!r})")
    body = await reader.readexactly(length)
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError("a frame must hold one JSON-RPC object")
    return message


def encode_frame(message: Mapping[str, Any]) -> bytes:
    payload = json.dumps(message, separators=(",", ":")).encode("utf-8")
    return b"Content-Length: " + str(len(payload)).encode("ascii") + b"\r\n\r\n" + payload


class Peer:
    """One side of a framed JSON-RPC stream."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handlers: Mapping[str, Handler] | None = None,
        *,
        name: str = "extension",
    ):
        self.reader = reader
        self.writer = writer
        self.handlers = dict(handlers or {})
        self.name = name
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()
        self._write_lock = asyncio.Lock()
        self.closed = asyncio.Event()
        self._reader_task: asyncio.Task | None = None

    def start(self) -> None:
        self._reader_task = asyncio.create_task(self._read_loop(), name=f"kodelet-{self.name}")

    async def request(self, method: str, params: Any = None, timeout: float | None = None) -> Any:
        if self.closed.is_set():
            raise PeerError(0, f"{self.name} is not running")
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self._send(message)
            async with asyncio.timeout(timeout):
                return await future
        except asyncio.CancelledError:
            # The extension stops the handler too (its SDK honours $/cancelRequest).
            with contextlib.suppress(Exception):
                await self.notify("$/cancelRequest", {"id": request_id})
            raise
        finally:
            self._pending.pop(request_id, None)

    async def notify(self, method: str, params: Any = None) -> None:
        message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    async def _send(self, message: Mapping[str, Any]) -> None:
        async with self._write_lock:
            self.writer.write(encode_frame(message))
            await self.writer.drain()

    async def _read_loop(self) -> None:
        try:
            while True:
                message = await read_frame(self.reader)
                if message is None:
                    break
                self._dispatch(message)
        except (ValueError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.warning("%s: broken frame stream (%s)", self.name, exc)
        finally:
            self.closed.set()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(PeerError(0, f"{self.name} stopped"))
            for task in list(self._tasks):
                task.cancel()

    def _dispatch(self, message: dict) -> None:
        method = message.get("method")
        if isinstance(method, str):
            if method == "$/cancelRequest":
                return  # host handlers are short or end with the run; nothing to stop
            task = asyncio.create_task(self._answer(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        future = self._pending.get(message.get("id"))
        if future is None or future.done():
            return
        error = message.get("error")
        if isinstance(error, Mapping):
            future.set_exception(
                PeerError(
                    int(error.get("code", 0)), str(error.get("message", "")), error.get("data")
                )
            )
        else:
            future.set_result(message.get("result"))

    async def _answer(self, message: dict) -> None:
        method, request_id = message["method"], message.get("id")
        handler = self.handlers.get(method)
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        if handler is None:
            reply["error"] = {"code": -32601, "message": f"method not found: {method}"}
        else:
            try:
                reply["result"] = await handler(message.get("params"))
            except PeerError as exc:
                reply["error"] = {"code": exc.code, "message": exc.message}
            except Exception as exc:
                log.exception("%s: host method %s failed", self.name, method)
                reply["error"] = {"code": -32603, "message": f"{type(exc).__name__}: {exc}"}
        if request_id is None:
            return  # a notification: nothing to answer
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._send(reply)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task

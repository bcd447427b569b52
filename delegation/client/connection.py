"""The socket side of :class:`RunnerClient`: handshake, ``runner.register`` on every
connection, reconnecting with backoff, raw calls resent after a lost answer, the reader."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from delegation import depth as depth_mod
from delegation.client.errors import (
    AuthenticationFailed,
    ClientClosed,
    ClientError,
    ClientTimeout,
    Fenced,
    _ConnectionLost,
    error_from_wire,
    is_retryable,
    retry_after,
)
from delegation.client.shapes import Extension, Registration
from delegation.client.streams import _UNSET, RunStream
from delegation.errors import RpcError
from delegation.protocol import CLOSE_FENCED, CLOSE_UNAUTHORIZED, MAX_FRAME_BYTES

log = logging.getLogger("canopy.client")


# A server command's handler gets its params and the client (a ``RunnerClient``; typed loosely
# so that this module imports nothing above it).
Handler = Callable[[dict, Any], Awaitable[Any]]


def server_urls(url: str | Iterable[str]) -> list[str]:
    """The servers to try, in order: one URL, a list of them, or one string of comma-separated
    URLs (as an environment variable holds them)."""
    items = [url] if isinstance(url, str) else list(url)
    urls = [part.strip() for item in items for part in item.split(",") if part.strip()]
    if not urls:
        raise ValueError("a runner client needs at least one server URL")
    return urls


@dataclass
class _Conn:
    ws: ClientConnection
    pending: dict[int, asyncio.Future] = field(default_factory=dict)
    registration: Registration | None = None
    closed: bool = False


class Connection:
    """The connection state of a :class:`RunnerClient` and the loop that keeps it alive.

    ``url`` may name several servers (behind one load balancer or not): they are tried in
    turn, with jittered backoff once a whole round has failed, and a lost connection moves on
    to the next one at once, so a runner is back on a live server within a fraction of a
    second when one process dies. The same ``host_instance_id`` is registered on every
    connection, so the server knows it is the same process and its runs go on.
    """

    def __init__(
        self,
        url: str | Iterable[str],
        token: str,
        *,
        extensions: Iterable[Extension] = (),
        host_instance_id: str | None = None,
        workspace: str | None = None,
        depth: int | None = _UNSET,
        call_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        reconnect: bool = True,
        proxy: str | bool | None = None,
        logger: logging.Logger | None = None,
    ):
        self.urls = server_urls(url)
        self._url_index = 0
        self.token = token
        self.extensions = list(extensions)
        self.host_instance_id = host_instance_id or f"{socket.gethostname()}-{os.getpid()}"[-128:]
        self.workspace = workspace
        self.depth = depth_mod.from_env() if depth is _UNSET else depth
        if self.depth is not None:
            depth_mod._require(self.depth)
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.reconnect = reconnect
        self.proxy = proxy
        self.log = logger or log

        self.registration: Registration | None = None
        self.connections = 0  # successful registrations so far (1 = first connection)
        self._handlers: dict[str, Handler] = {}
        self._streams: dict[str, RunStream] = {}
        self._conn: _Conn | None = None
        self._ready = asyncio.Event()
        self._state_changed = asyncio.Event()
        self._fatal: BaseException | None = None
        self._closing = False
        self._supervisor: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._ids = itertools.count(1)
        # Server command ids already answered (resent answers after a reconnect) or running.
        self._answers: OrderedDict[str, dict] = OrderedDict()
        self._running_commands: dict[str, asyncio.Task] = {}
        self._on_connect: list[Callable[[Registration], Awaitable[None]]] = []

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def connect(self, timeout: float | None = None) -> Registration:
        """Start the connection loop and wait for the first registration.

        The loop keeps trying (with backoff) until ``timeout`` (default ``call_timeout``), so a
        runner may be started before its server. A refused token raises at once.
        """
        if self._supervisor is None:
            self._closing = False
            self._supervisor = asyncio.create_task(self._supervise(), name="canopy-client")
        await self._wait_ready(self.call_timeout if timeout is None else timeout)
        assert self.registration is not None
        return self.registration

    async def close(self) -> None:
        self._closing = True
        self._set_fatal(ClientClosed("client closed"))
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.ws.close()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._supervisor
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    @property
    def url(self) -> str:
        """The server this client is connected to, or tries next."""
        return self.urls[self._url_index]

    @property
    def connected(self) -> bool:
        return self._ready.is_set()

    async def drop_connection(self) -> None:
        """Close the current socket abruptly, as a network failure would (tests, diagnostics)."""
        conn = self._conn
        if conn is not None:
            conn.ws.transport.abort()

    # -- raw calls ---------------------------------------------------------------------

    async def call(self, method: str, params: Mapping[str, Any], timeout: float | None = None):
        """Send a request and return its ``result``; raise the typed error it answers.

        Waits for a connection if there is none; if the connection drops before the answer,
        sends the same request again on the next one (runner methods are idempotent).
        """
        loop = asyncio.get_running_loop()
        timeout = self.call_timeout if timeout is None else timeout
        deadline = loop.time() + timeout
        params = dict(params)
        backoff = self.backoff_initial
        while True:
            conn = await self._wait_ready(deadline - loop.time(), what=method)
            try:
                return await self._call_on(conn, method, params, deadline - loop.time())
            except _ConnectionLost:
                if loop.time() >= deadline:
                    raise ClientTimeout(
                        f"{method}: connection lost and no answer in time"
                    ) from None
                self.log.debug("%s: connection lost before the answer; resending", method)
                continue
            except RpcError as exc:
                # The server says the call failed on its side for a passing reason (its
                # database connection dropped, or it is saturated and asks for a pause:
                # ``retryAfterMs``) and changed nothing a resend would repeat.
                remaining = deadline - loop.time()
                if not is_retryable(exc) or remaining <= 0:
                    raise
                asked = retry_after(exc)
                pause = backoff if asked is None else max(asked, self.backoff_initial)
                # A pause asked for is the server working as meant, not a fault.
                report = self.log.warning if asked is None else self.log.info
                report("%s: %s; retrying in %.2fs", method, exc.message, pause)
                await asyncio.sleep(min(pause, remaining))
                if asked is None:
                    backoff = min(backoff * 2, self.backoff_max)

    async def _call_on(self, conn: _Conn, method: str, params: dict, timeout: float):
        if conn.closed:
            raise _ConnectionLost()
        loop = asyncio.get_running_loop()
        request_id = next(self._ids)
        future: asyncio.Future = loop.create_future()
        conn.pending[request_id] = future
        frame = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        try:
            try:
                await conn.ws.send(json.dumps(frame, ensure_ascii=False))
            except ConnectionClosed:
                # The socket is closing but the reader has not noticed yet. Retire the
                # connection now: retrying on it would spin without ever yielding to the
                # reader (a send on a closed socket fails without awaiting anything).
                self._retire(conn)
                await asyncio.sleep(0)
                raise _ConnectionLost() from None
            try:
                async with asyncio.timeout(max(timeout, 0)):
                    message = await future
            except TimeoutError:
                raise ClientTimeout(f"{method}: no answer within {timeout:.1f}s") from None
        finally:
            conn.pending.pop(request_id, None)
        if "error" in message:
            raise error_from_wire(message["error"])
        return message.get("result")

    async def _wait_ready(self, timeout: float, what: str = "connect") -> _Conn:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0)
        while True:
            if self._fatal is not None:
                raise self._fatal
            conn = self._conn
            if self._ready.is_set() and conn is not None and not conn.closed:
                return conn
            if self._supervisor is None:
                raise ClientError("client not started: call connect() first")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ClientTimeout(f"{what}: not connected to {self.url} in time")
            self._state_changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._state_changed.wait()

    def _retire(self, conn: _Conn) -> None:
        conn.closed = True
        if self._conn is conn:
            self._conn = None
            self._ready.clear()
            self._state_changed.set()

    def _set_fatal(self, exc: BaseException) -> None:
        if self._fatal is None:
            self._fatal = exc
        self._ready.clear()
        self._state_changed.set()

    # -- connection loop ---------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"}
        if self.depth is not None:
            headers[depth_mod.HEADER] = str(self.depth)
        return headers

    def _register_params(self) -> dict:
        params: dict[str, Any] = {
            "hostInstanceId": self.host_instance_id,
            "extensions": [ext.wire() for ext in self.extensions],
        }
        if self.workspace is not None:
            params["workspace"] = self.workspace
        return params

    def _backoff(self, attempt: int) -> float:
        # Grows once per round over every server, not per server: each is tried soon.
        rounds = attempt // len(self.urls)
        delay = min(self.backoff_max, self.backoff_initial * (2 ** min(rounds, 16)))
        return delay * (0.5 + random.random() / 2)  # jitter: reconnecting runners spread out

    def _direct_connect_options(self) -> dict:
        # A name that resolves to several addresses: the next one is tried after 0.25 s
        # instead of after a dead one's whole connect timeout (through a proxy, the proxy
        # resolves the name).
        return {} if self.proxy else {"happy_eyeballs_delay": 0.25}

    def _next_server(self) -> None:
        if len(self.urls) > 1:
            self._url_index = (self._url_index + 1) % len(self.urls)
            self.log.info("trying the next server: %s", self.url)

    async def _supervise(self) -> None:
        attempt = 0
        while not self._closing:
            try:
                ws = await connect(
                    self.url,
                    additional_headers=self._headers(),
                    open_timeout=self.connect_timeout,
                    max_size=MAX_FRAME_BYTES,
                    proxy=self.proxy,
                    ping_interval=20,
                    ping_timeout=20,
                    **self._direct_connect_options(),
                )
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in (401, 403):
                    self._set_fatal(AuthenticationFailed(f"handshake refused: HTTP {status}"))
                    return
                self.log.warning("handshake refused: HTTP %s; retrying", status)
            except (OSError, TimeoutError, WebSocketException) as exc:
                self.log.info("cannot connect to %s: %s", self.url, exc)
            else:
                outcome = await self._serve_connection(_Conn(ws))
                if outcome == "fatal":
                    return
                if outcome == "registered":
                    attempt = 0
            if self._closing or not self.reconnect:
                if self._fatal is None:
                    self._set_fatal(ClientClosed("connection lost and reconnect is off"))
                return
            # The server that failed, or whose connection was lost, is likely down: the next
            # one is tried first (the same one again when there is only one).
            self._next_server()
            await asyncio.sleep(self._backoff(attempt))
            attempt += 1

    async def _serve_connection(self, conn: _Conn) -> str:
        reader = asyncio.create_task(self._read(conn), name="canopy-client-reader")
        outcome = "lost"
        try:
            try:
                result = await self._call_on(
                    conn, "runner.register", self._register_params(), self.connect_timeout
                )
            except (_ConnectionLost, ClientTimeout):
                conn.ws.transport.abort()  # the reader below ends with it
            except RpcError as exc:
                # A refused registration will be refused again: stop rather than spin.
                self._set_fatal(exc)
                outcome = "fatal"
            else:
                reg = Registration(
                    runner_id=str(result.get("runnerId", "")),
                    connection_generation=int(result.get("connectionGeneration", 0)),
                )
                conn.registration = reg
                self.registration = reg
                self.connections += 1
                self._conn = conn
                self._ready.set()
                self._state_changed.set()
                outcome = "registered"
                self.log.info(
                    "registered as %s (connection generation %s)",
                    reg.runner_id,
                    reg.connection_generation,
                )
                self._spawn(self._after_register(reg))
            await reader
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._retire(conn)
            for future in conn.pending.values():
                if not future.done():
                    future.set_exception(_ConnectionLost())
            conn.pending.clear()
        code = conn.ws.close_code
        if code == CLOSE_UNAUTHORIZED:
            self._set_fatal(AuthenticationFailed("runner token refused (close 4401)"))
            return "fatal"
        if code == CLOSE_FENCED:
            self._set_fatal(Fenced("a newer connection of this runner took over (close 4409)"))
            return "fatal"
        if outcome == "fatal":
            with contextlib.suppress(Exception):
                await conn.ws.close()
        return outcome

    async def _after_register(self, reg: Registration) -> None:
        # Events the server has not confirmed go out again at once, not at the next emit.
        for stream in list(self._streams.values()):
            if stream.unconfirmed:
                self._spawn(self._flush_quietly(stream))
        for callback in list(self._on_connect):
            try:
                await callback(reg)
            except Exception:
                self.log.exception("on_connect callback failed")

    async def _flush_quietly(self, stream: RunStream) -> None:
        try:
            await stream.flush()
        except Exception as exc:
            self.log.warning("resending events of %s failed: %s", stream.run_id, exc)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _read(self, conn: _Conn) -> None:
        try:
            async for raw in conn.ws:
                if isinstance(raw, bytes):
                    self.log.warning("ignoring a binary frame")
                    continue
                try:
                    message = json.loads(raw)
                except ValueError:
                    self.log.warning("ignoring a frame that is not JSON: %.200s", raw)
                    continue
                if not isinstance(message, dict):
                    self.log.warning("ignoring a frame that is not an object: %.200s", raw)
                    continue
                if "method" in message:
                    self._on_command(conn, message)
                    continue
                future = conn.pending.get(message.get("id"))
                if future is not None and not future.done():
                    future.set_result(message)
                elif "error" in message:
                    # An error without a request id: the server refusing the connection itself
                    # (e.g. −32002 before a fencing close). Logged; the close code decides.
                    self.log.warning("server error: %s", message["error"])
        except ConnectionClosed:
            pass

    async def _send(self, conn: _Conn, frame: dict) -> None:
        if conn.closed:
            return
        with contextlib.suppress(ConnectionClosed):
            await conn.ws.send(json.dumps(frame, ensure_ascii=False))


def _dump_params(params: Mapping[str, Any]) -> str:  # pragma: no cover - debugging aid
    return json.dumps(params, ensure_ascii=False, sort_keys=True)

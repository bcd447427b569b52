"""Canopy runner SDK: connect an agent host to the control plane (SPEC §5-§6).

Pure asyncio + ``websockets``; no Django, so any agent host can vendor it. A minimal host::

    async with RunnerClient(url, token, extensions=[Extension("my-ext", 1, [Preset("coder")])]) as c:
        await c.open_run("conv-1", "run-1")
        await c.emit("run-1", event("text", text="hello"))
        child = await c.child_start("run-1", "my-ext", 1, {"requestId": "r1", "profile": "coder",
                                                          "message": "write the tests"})
        await c.finish("run-1", output="done")

What the client takes care of:

- the handshake: ``Authorization: Bearer <token>`` and, when a level is declared (by default
  ``PANDO_DELEGATION_DEPTH`` from the environment), ``X-Pando-Delegation-Depth``;
- ``runner.register`` on every connection, re-sending the same extensions and presets;
- the runner-side event numbering: each run's events are kept until the server confirms them
  (``emitted``), and every frame says ``from`` which index it starts, so a frame lost in a
  dropped connection is simply sent again and the stored stream holds each event exactly once;
- reconnecting with exponential backoff; a call made while disconnected waits for the next
  connection (up to its timeout), and a call whose answer was lost is sent again. Every runner
  method is idempotent on the server (replayed events are skipped, ``child.start`` and
  ``child.steer`` are keyed by ``requestId``), which is what makes resending safe;
- server commands (``child.execute``, ``run.cancel``, ``run.steer``, ``lease.revoked``) are
  dispatched to the handlers the host registers with :meth:`RunnerClient.on`; a command the
  server redelivers after a reconnect is answered from the stored answer, not run twice.

Errors the server answers are raised as :class:`RpcError` subclasses carrying the SPEC code
(``DepthLimitReached`` is −32010, ``NotOwned`` −32003, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import socket
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from delegation import depth as depth_mod
from delegation import errors as codes
from delegation.errors import RpcError
from delegation.protocol import (
    CLOSE_FENCED,
    CLOSE_UNAUTHORIZED,
    MAX_FRAME_BYTES,
    SERVER_EVENT_KINDS,
)

__all__ = [
    "AdmissionRefused",
    "AuthenticationFailed",
    "ClientClosed",
    "ClientError",
    "ClientTimeout",
    "DepthLimitReached",
    "EmitAck",
    "Event",
    "ExecuteCommand",
    "Extension",
    "Fenced",
    "Identity",
    "InvalidParams",
    "LeaseGone",
    "NoSuchRun",
    "NotOwned",
    "NotRegistered",
    "ParentNotRunning",
    "Preset",
    "PresetStale",
    "Registration",
    "ReleaseUnconfirmed",
    "RequestIdReused",
    "Result",
    "RpcError",
    "RunStream",
    "RunnerClient",
    "StaleConnection",
    "SteerOutcome",
    "event",
]

log = logging.getLogger("canopy.client")

EVENT_FIELDS = ("kind", "text", "toolName", "toolCallId", "input", "toolOutput", "success", "error")
# The server refuses frames over MAX_FRAME_BYTES; stay well below it when batching events.
BATCH_BYTES = 768 * 1024
BATCH_EVENTS = 256
MAX_EVENT_BYTES = 512 * 1024

_UNSET: Any = object()


# --- errors -------------------------------------------------------------------------------


class ClientError(Exception):
    """Something went wrong on the client side of the connection (not a server refusal)."""


class ClientTimeout(ClientError, TimeoutError):
    """No answer in time: the server was unreachable or silent for the whole call timeout."""


class ClientClosed(ClientError):
    """The client was closed (or gave up for good) while the call was waiting."""


class AuthenticationFailed(ClientError):
    """The server refused the runner token (close 4401 or an HTTP 401/403 handshake)."""


class Fenced(ClientError):
    """A newer connection of the same runner took over (close 4409); this one stops for good."""


class NotRegistered(RpcError):
    pass


class StaleConnection(RpcError):
    pass


class InvalidParams(RpcError):
    pass


class NotOwned(RpcError):
    pass


class NoSuchRun(RpcError):
    pass


class DepthLimitReached(RpcError):
    """−32010: the calling agent is at the cap. Soft: the model should finish the work itself."""


class AdmissionRefused(RpcError):
    pass


class PresetStale(RpcError):
    pass


class RequestIdReused(RpcError):
    pass


class ParentNotRunning(RpcError):
    pass


class LeaseGone(RpcError):
    pass


class ReleaseUnconfirmed(RpcError):
    """−32016: children under the lease have not confirmed yet; call release again."""


_ERROR_TYPES: dict[int, type[RpcError]] = {
    codes.NOT_REGISTERED: NotRegistered,
    codes.STALE_CONNECTION: StaleConnection,
    codes.INVALID_PARAMS: InvalidParams,
    codes.NOT_OWNED: NotOwned,
    codes.NO_SUCH_RUN: NoSuchRun,
    codes.DEPTH_LIMIT: DepthLimitReached,
    codes.ADMISSION_REFUSED: AdmissionRefused,
    codes.PRESET_STALE: PresetStale,
    codes.REQUEST_ID_REUSED: RequestIdReused,
    codes.PARENT_NOT_RUNNING: ParentNotRunning,
    codes.LEASE_GONE: LeaseGone,
    codes.RELEASE_UNCONFIRMED: ReleaseUnconfirmed,
}


def error_from_wire(error: Any) -> RpcError:
    """The typed exception for a JSON-RPC ``error`` member."""
    if not isinstance(error, Mapping):
        return RpcError(codes.INTERNAL_ERROR, f"malformed error member: {error!r}")
    code = error.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        code = codes.INTERNAL_ERROR
    message = error.get("message")
    if not isinstance(message, str):
        message = str(message)
    return _ERROR_TYPES.get(code, RpcError)(code, message, error.get("data"))


def is_retryable(error: RpcError) -> bool:
    """Whether the server marked a failure as passing (``data.retryable``): send it again."""
    data = error.data
    return isinstance(data, Mapping) and data.get("retryable") is True


class _ConnectionLost(Exception):
    """Internal: the connection a call was sent on went away before the answer came."""


# --- typed shapes -------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    """An execution profile an extension offers (prompt content, never a path)."""

    name: str
    system_prompt: str = ""
    options: Mapping[str, Any] | None = None

    def wire(self) -> dict:
        out: dict[str, Any] = {"name": self.name}
        if self.system_prompt:
            out["systemPrompt"] = self.system_prompt
        if self.options:
            out["options"] = dict(self.options)
        return out


@dataclass(frozen=True)
class Extension:
    extension_id: str
    generation: int
    presets: tuple[Preset, ...] | list[Preset] = ()

    def wire(self) -> dict:
        return {
            "extensionId": self.extension_id,
            "generation": self.generation,
            "presets": [p.wire() for p in self.presets],
        }


@dataclass(frozen=True)
class Registration:
    runner_id: str
    connection_generation: int


@dataclass(frozen=True)
class EmitAck:
    emitted: int
    sequence: int


@dataclass(frozen=True)
class Event:
    """A stored event as readers see it, numbered by the server."""

    sequence: int
    kind: str
    text: str | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    input: Any = None
    tool_output: Any = None
    success: bool | None = None
    error: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Event:
        return cls(
            sequence=int(data.get("sequence", 0)),
            kind=str(data.get("kind", "")),
            text=data.get("text"),
            tool_name=data.get("toolName"),
            tool_call_id=data.get("toolCallId"),
            input=data.get("input"),
            tool_output=data.get("toolOutput"),
            success=data.get("success"),
            error=data.get("error"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Result:
    """A run snapshot (SPEC §6 ``Result``); ``child_id`` is the child's conversationId."""

    runner_id: str
    host_instance_id: str
    conversation_id: str
    run_id: str
    parent_conversation_id: str
    parent_run_id: str
    extension_id: str
    profile: str
    done: bool
    cancelled: bool
    error: str
    output: str
    events: list[Event]
    depth: int
    status: str
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def child_id(self) -> str:
        return self.conversation_id

    @property
    def last_sequence(self) -> int:
        return self.events[-1].sequence if self.events else 0

    @classmethod
    def from_wire(cls, data: Any) -> Result:
        if not isinstance(data, Mapping):
            raise RpcError(codes.INTERNAL_ERROR, f"expected a Result object, got {data!r}")
        return cls(
            runner_id=data.get("runnerId", ""),
            host_instance_id=data.get("hostInstanceId", ""),
            conversation_id=data.get("conversationId", ""),
            run_id=data.get("runId", ""),
            parent_conversation_id=data.get("parentConversationId", ""),
            parent_run_id=data.get("parentRunId", ""),
            extension_id=data.get("extensionId", ""),
            profile=data.get("profile", ""),
            done=bool(data.get("done", False)),
            cancelled=bool(data.get("cancelled", False)),
            error=data.get("error", "") or "",
            output=data.get("output", "") or "",
            events=[Event.from_wire(e) for e in data.get("events") or []],
            depth=int(data.get("depth", 0) or 0),
            status=data.get("status", ""),
            raw=dict(data),
        )


@dataclass(frozen=True)
class SteerOutcome:
    outcome: str
    reason: str = ""

    @property
    def injected(self) -> bool:
        return self.outcome == "injected"


@dataclass(frozen=True)
class Identity:
    """Who a child is (the ``identity`` of ``child.execute``)."""

    runner_id: str
    host_instance_id: str
    conversation_id: str
    run_id: str
    parent_conversation_id: str
    parent_run_id: str
    extension_id: str
    profile: str

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Identity:
        return cls(
            runner_id=data.get("runnerId", ""),
            host_instance_id=data.get("hostInstanceId", ""),
            conversation_id=data.get("conversationId", ""),
            run_id=data.get("runId", ""),
            parent_conversation_id=data.get("parentConversationId", ""),
            parent_run_id=data.get("parentRunId", ""),
            extension_id=data.get("extensionId", ""),
            profile=data.get("profile", ""),
        )


@dataclass(frozen=True)
class ExecuteCommand:
    """A ``child.execute`` command: run this child at ``depth`` with the frozen preset."""

    identity: Identity
    request: Mapping[str, Any]
    preset: Preset
    depth: int
    lease_id: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def run_id(self) -> str:
        return self.identity.run_id

    @property
    def message(self) -> str:
        return self.request.get("message", "")

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> ExecuteCommand:
        preset = params.get("preset") or {}
        return cls(
            identity=Identity.from_wire(params.get("identity") or {}),
            request=dict(params.get("request") or {}),
            preset=Preset(
                name=preset.get("name", ""),
                system_prompt=preset.get("systemPrompt", "") or "",
                options=preset.get("options"),
            ),
            depth=int(params.get("depth", 0)),
            lease_id=params.get("leaseId"),
            raw=dict(params),
        )


def event(
    kind: str,
    text: str | None = None,
    *,
    tool_name: str | None = None,
    tool_call_id: str | None = None,
    input: Any = _UNSET,
    tool_output: Any = _UNSET,
    success: bool | None = None,
    error: str | None = None,
) -> dict:
    """Build a runner event (wire form, without ``sequence``: the server numbers the stream)."""
    out: dict[str, Any] = {"kind": kind}
    if text is not None:
        out["text"] = text
    if tool_name is not None:
        out["toolName"] = tool_name
    if tool_call_id is not None:
        out["toolCallId"] = tool_call_id
    if input is not _UNSET:
        out["input"] = input
    if tool_output is not _UNSET:
        out["toolOutput"] = tool_output
    if success is not None:
        out["success"] = success
    if error is not None:
        out["error"] = error
    return out


def _check_event(ev: Mapping[str, Any]) -> dict:
    if not isinstance(ev, Mapping):
        raise TypeError(f"an event is a mapping, not {type(ev).__name__}")
    unknown = set(ev) - set(EVENT_FIELDS)
    if "sequence" in unknown:
        raise ValueError("runner events carry no 'sequence': the server numbers the stream")
    if unknown:
        raise ValueError(f"unknown event field(s): {', '.join(sorted(unknown))}")
    kind = ev.get("kind")
    if not isinstance(kind, str) or not kind.strip():
        raise ValueError("an event needs a non-blank 'kind'")
    if kind in SERVER_EVENT_KINDS:
        raise ValueError(f"event kind {kind!r} is the server's own; runners may not emit it")
    # None means "absent" on the wire: the server refuses explicit nulls it does not expect.
    out = {k: v for k, v in ev.items() if v is not None}
    size = len(json.dumps(out, ensure_ascii=False).encode("utf-8"))
    if size > MAX_EVENT_BYTES:
        # Refused here, not by the server: a frame over 1 MiB would be refused without an
        # answer to retry on, and the run's stream would be stuck behind it for good.
        raise ValueError(
            f"event of {size} bytes is over {MAX_EVENT_BYTES}; the server keeps 32 KiB per "
            "field anyway, so cut it before emitting"
        )
    return out


# --- per-run outgoing stream --------------------------------------------------------------


class RunStream:
    """The runner-side numbering of one run's events (SPEC §5 ``from`` / ``emitted``).

    Events are appended locally first and stay buffered until the server confirms them, so a
    frame lost with a connection is sent again from ``emitted + 1``.
    """

    def __init__(self, client: RunnerClient, run_id: str, emitted: int = 0):
        self.client = client
        self.run_id = run_id
        self.emitted = emitted  # confirmed by the server
        self.sequence = 0  # the stream head the server last reported
        self._pending: list[dict] = []  # events emitted + 1 .. appended
        self._lock = asyncio.Lock()
        self.finished = False
        self.finishing = False

    @property
    def appended(self) -> int:
        return self.emitted + len(self._pending)

    @property
    def unconfirmed(self) -> int:
        return len(self._pending)

    def append(self, *events: Mapping[str, Any]) -> int:
        """Buffer events without sending; returns the runner index of the last one."""
        if self.finished or self.finishing:
            raise ClientError(f"run {self.run_id} is finished; no more events")
        checked = [_check_event(ev) for ev in events]
        self._pending.extend(checked)
        return self.appended

    async def emit(self, *events: Mapping[str, Any], timeout: float | None = None) -> EmitAck:
        """Append events and wait until the server has stored them (and everything before)."""
        target = self.append(*events)
        return await self.flush(target, timeout=timeout)

    async def flush(self, target: int | None = None, timeout: float | None = None) -> EmitAck:
        """Send buffered events until the server has confirmed index ``target`` (default: all)."""
        timeout = self.client.call_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(timeout):
                async with self._lock:
                    target = self.appended if target is None else target
                    while self.emitted < target and self._pending:
                        before = self.emitted
                        batch = _batch(self._pending)
                        result = await self.client.call(
                            "run.event",
                            {"runId": self.run_id, "from": self.emitted + 1, "events": batch},
                            timeout=timeout,
                        )
                        self._confirm(result)
                        if self.emitted == before:
                            raise RpcError(
                                codes.INTERNAL_ERROR,
                                f"run.event stored nothing for {self.run_id} from {before + 1}",
                            )
        except TimeoutError as exc:
            if isinstance(exc, ClientTimeout):
                raise
            raise ClientTimeout(
                f"run.event: {self.run_id} not confirmed within {timeout:.1f}s "
                f"({self.unconfirmed} event(s) still buffered)"
            ) from None
        return EmitAck(self.emitted, self.sequence)

    def _confirm(self, result: Any) -> None:
        if not isinstance(result, Mapping) or not isinstance(result.get("emitted"), int):
            raise RpcError(codes.INTERNAL_ERROR, f"run.event answered {result!r}")
        emitted = result["emitted"]
        stored = emitted - self.emitted
        if stored > 0:
            del self._pending[:stored]
            self.emitted = emitted
        self.sequence = int(result.get("sequence", self.sequence))

    async def text(self, text: str) -> EmitAck:
        return await self.emit(event("text", text))

    async def finish(
        self,
        output: str | None = None,
        error: str | None = None,
        cancelled: bool | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Flush every buffered event, then end the run."""
        timeout = self.client.call_timeout if timeout is None else timeout
        self.finishing = True  # events appended from now on would never be sent: refuse them
        await self.flush(timeout=timeout)
        params: dict[str, Any] = {"runId": self.run_id}
        if output is not None:
            params["output"] = output
        if error is not None:
            params["error"] = error
        if cancelled is not None:
            params["cancelled"] = cancelled
        result = await self.client.call("run.finish", params, timeout=timeout)
        self.finished = True
        self.client._streams.pop(self.run_id, None)
        return result


def _batch(pending: list[dict]) -> list[dict]:
    """The longest prefix of ``pending`` that fits one frame comfortably."""
    out, size = [], 0
    for ev in pending[:BATCH_EVENTS]:
        cost = len(json.dumps(ev, ensure_ascii=False).encode("utf-8")) + 1
        if out and size + cost > BATCH_BYTES:
            break
        out.append(ev)
        size += cost
    return out


# --- the client ---------------------------------------------------------------------------


Handler = Callable[[dict, "RunnerClient"], Awaitable[Any]]


@dataclass
class _Conn:
    ws: ClientConnection
    pending: dict[int, asyncio.Future] = field(default_factory=dict)
    registration: Registration | None = None
    closed: bool = False


class RunnerClient:
    """An authenticated, self-healing runner connection.

    ``depth`` is the level this runner declares on the handshake; by default it is read from
    ``PANDO_DELEGATION_DEPTH`` (an invalid value means "not declared"); pass ``None`` to
    declare nothing.
    """

    def __init__(
        self,
        url: str,
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
        self.url = url
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

    async def __aenter__(self) -> RunnerClient:
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
    def connected(self) -> bool:
        return self._ready.is_set()

    async def drop_connection(self) -> None:
        """Close the current socket abruptly, as a network failure would (tests, diagnostics)."""
        conn = self._conn
        if conn is not None:
            conn.ws.transport.abort()

    def on(self, method: str, handler: Handler | None = None):
        """Register the handler of a server command; usable as a decorator.

        A handler gets ``(params, client)`` and returns the JSON result (``None`` → ``{}``);
        raising :class:`RpcError` answers with that error. Unhandled commands are answered
        with −32601.
        """
        if handler is None:

            def decorator(fn: Handler) -> Handler:
                self._handlers[method] = fn
                return fn

            return decorator
        self._handlers[method] = handler
        return handler

    def on_connect(self, callback: Callable[[Registration], Awaitable[None]]) -> None:
        """Run ``callback(registration)`` after every successful (re-)registration."""
        self._on_connect.append(callback)

    # -- runs and events ---------------------------------------------------------------

    def stream(self, run_id: str, emitted: int = 0) -> RunStream:
        """The outgoing stream of ``run_id`` (created on first use).

        ``emitted`` seeds the numbering for a run this process did not start (e.g. a runner
        restarted and continuing a run the server already holds events for).
        """
        stream = self._streams.get(run_id)
        if stream is None:
            stream = self._streams[run_id] = RunStream(self, run_id, emitted)
        return stream

    async def open_run(
        self,
        conversation_id: str,
        run_id: str,
        *,
        profile: str | None = None,
        extension_id: str | None = None,
        depth: int | None = None,
        meta: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Result:
        """``run.open``: a top-level run. ``depth`` is declared through ``_meta``."""
        params: dict[str, Any] = {"conversationId": conversation_id, "runId": run_id}
        if profile is not None:
            params["profile"] = profile
        if extension_id is not None:
            params["extensionId"] = extension_id
        if depth is not None:
            meta = depth_mod.meta(depth, meta)
        if meta is not None:
            params["_meta"] = dict(meta)
        result = Result.from_wire(await self.call("run.open", params, timeout=timeout))
        self.stream(run_id)
        return result

    async def emit(self, run_id: str, *events: Mapping[str, Any], timeout=None) -> EmitAck:
        return await self.stream(run_id).emit(*events, timeout=timeout)

    async def finish(
        self,
        run_id: str,
        output: str | None = None,
        error: str | None = None,
        cancelled: bool | None = None,
        timeout: float | None = None,
    ) -> Any:
        return await self.stream(run_id).finish(output, error, cancelled, timeout=timeout)

    async def tool_end(self, run_id: str, tool_call_id: str, timeout=None) -> Any:
        return await self.call(
            "tool.end", {"runId": run_id, "toolCallId": tool_call_id}, timeout=timeout
        )

    # -- the five child methods --------------------------------------------------------

    async def child_start(
        self,
        run_id: str,
        extension_id: str,
        generation: int,
        request: Mapping[str, Any],
        *,
        tool_call_id: str | None = None,
        lease_id: str | None = None,
        timeout: float | None = None,
    ) -> Result:
        params: dict[str, Any] = {
            "runId": run_id,
            "extensionId": extension_id,
            "generation": generation,
            "request": dict(request),
        }
        if tool_call_id is not None:
            params["toolCallId"] = tool_call_id
        if lease_id is not None:
            params["leaseId"] = lease_id
        return Result.from_wire(await self.call("child.start", params, timeout=timeout))

    async def child_read(
        self,
        run_id: str,
        extension_id: str,
        generation: int,
        child_id: str,
        *,
        child_run_id: str | None = None,
        after: int | None = None,
        lease_id: str | None = None,
        timeout: float | None = None,
    ) -> Result:
        params = self._child_params(run_id, extension_id, generation, child_id, child_run_id)
        if after is not None:
            params["after"] = after
        if lease_id is not None:
            params["leaseId"] = lease_id
        return Result.from_wire(await self.call("child.read", params, timeout=timeout))

    async def child_cancel(
        self,
        run_id: str,
        extension_id: str,
        generation: int,
        child_id: str,
        *,
        child_run_id: str | None = None,
        lease_id: str | None = None,
        timeout: float | None = None,
    ) -> Result:
        params = self._child_params(run_id, extension_id, generation, child_id, child_run_id)
        if lease_id is not None:
            params["leaseId"] = lease_id
        return Result.from_wire(await self.call("child.cancel", params, timeout=timeout))

    async def child_steer(
        self,
        run_id: str,
        extension_id: str,
        generation: int,
        child_id: str,
        message: str,
        *,
        request_id: str | None = None,
        child_run_id: str | None = None,
        lease_id: str | None = None,
        timeout: float | None = None,
    ) -> SteerOutcome:
        params = self._child_params(run_id, extension_id, generation, child_id, child_run_id)
        params["message"] = message
        # Chosen once, before the first attempt, so a resent steer stays one steer.
        params["requestId"] = request_id or f"steer-{uuid.uuid4().hex}"
        if lease_id is not None:
            params["leaseId"] = lease_id
        result = await self.call("child.steer", params, timeout=timeout)
        if not isinstance(result, Mapping):
            raise RpcError(codes.INTERNAL_ERROR, f"child.steer answered {result!r}")
        return SteerOutcome(str(result.get("outcome", "")), str(result.get("reason", "") or ""))

    async def lease_release(
        self,
        lease_id: str,
        extension_id: str,
        generation: int,
        *,
        retry_until: float | None = None,
        timeout: float | None = None,
    ) -> Any:
        """``child.lease.release``; with ``retry_until`` seconds, retries −32016 until then."""
        params = {"leaseId": lease_id, "extensionId": extension_id, "generation": generation}
        loop = asyncio.get_running_loop()
        deadline = None if retry_until is None else loop.time() + retry_until
        while True:
            try:
                return await self.call("child.lease.release", params, timeout=timeout)
            except ReleaseUnconfirmed:
                if deadline is None or loop.time() >= deadline:
                    raise
                await asyncio.sleep(0.2)

    @staticmethod
    def _child_params(run_id, extension_id, generation, child_id, child_run_id) -> dict:
        params: dict[str, Any] = {
            "runId": run_id,
            "extensionId": extension_id,
            "generation": generation,
            "childId": child_id,
        }
        if child_run_id is not None:
            params["childRunId"] = child_run_id
        return params

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
                # database connection dropped) and changed nothing a resend would repeat.
                remaining = deadline - loop.time()
                if not is_retryable(exc) or remaining <= 0:
                    raise
                self.log.warning("%s: %s; retrying in %.2fs", method, exc.message, backoff)
                await asyncio.sleep(min(backoff, remaining))
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
        delay = min(self.backoff_max, self.backoff_initial * (2 ** min(attempt, 16)))
        return delay * (0.5 + random.random() / 2)  # jitter: reconnecting runners spread out

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

    # -- server commands ---------------------------------------------------------------

    def _on_command(self, conn: _Conn, message: dict) -> None:
        method = message.get("method")
        command_id = message.get("id")
        if command_id is None:
            self.log.info("server notification %s ignored", method)
            return
        key = json.dumps(command_id)
        answer = self._answers.get(key)
        if answer is not None:
            # Redelivered after a reconnect: the earlier answer was lost with its connection.
            self._spawn(self._send(conn, answer))
            return
        if key in self._running_commands:
            return  # still being handled; its answer goes out on whatever connection is live
        task = self._spawn(self._handle_command(key, command_id, method, message.get("params")))
        self._running_commands[key] = task

    async def _handle_command(self, key: str, command_id, method, params) -> None:
        try:
            handler = self._handlers.get(method)
            if handler is None:
                answer = {
                    "jsonrpc": "2.0",
                    "id": command_id,
                    "error": {"code": codes.METHOD_NOT_FOUND, "message": f"no handler: {method}"},
                }
            else:
                try:
                    result = await handler(params if isinstance(params, dict) else {}, self)
                    answer = {
                        "jsonrpc": "2.0",
                        "id": command_id,
                        "result": {} if result is None else result,
                    }
                except RpcError as exc:
                    answer = {"jsonrpc": "2.0", "id": command_id, "error": exc.wire()}
                except Exception as exc:
                    self.log.exception("handler of %s failed", method)
                    answer = {
                        "jsonrpc": "2.0",
                        "id": command_id,
                        "error": {"code": codes.INTERNAL_ERROR, "message": str(exc)},
                    }
            self._answers[key] = answer
            while len(self._answers) > 4096:
                self._answers.popitem(last=False)
        finally:
            self._running_commands.pop(key, None)
        conn = self._conn
        if conn is not None:
            await self._send(conn, answer)
        # Otherwise the server redelivers the command after the reconnect, and the stored
        # answer goes out then.

    async def _send(self, conn: _Conn, frame: dict) -> None:
        if conn.closed:
            return
        with contextlib.suppress(ConnectionClosed):
            await conn.ws.send(json.dumps(frame, ensure_ascii=False))


def _dump_params(params: Mapping[str, Any]) -> str:  # pragma: no cover - debugging aid
    return json.dumps(params, ensure_ascii=False, sort_keys=True)

"""Events and the per-run outgoing stream: ``event``, its checks, :class:`RunStream`'s
numbering (``from`` / ``emitted``) and the batching of events into frames."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, Protocol

from delegation import errors as codes
from delegation.client.errors import ClientError, ClientTimeout
from delegation.client.shapes import EmitAck
from delegation.errors import RpcError
from delegation.protocol import SERVER_EVENT_KINDS

EVENT_FIELDS = ("kind", "text", "toolName", "toolCallId", "input", "toolOutput", "success", "error")
# The server refuses frames over MAX_FRAME_BYTES; stay well below it when batching events.
BATCH_BYTES = 768 * 1024
BATCH_EVENTS = 256
MAX_EVENT_BYTES = 512 * 1024

_UNSET: Any = object()


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


class StreamOwner(Protocol):
    """What a :class:`RunStream` needs of its client (the ``RunnerClient``), named here so that
    this module imports nothing above it."""

    call_timeout: float
    _streams: dict[str, RunStream]

    async def call(self, method: str, params: Mapping[str, Any], timeout: float | None = None): ...


class RunStream:
    """The runner-side numbering of one run's events (SPEC §5 ``from`` / ``emitted``).

    Events are appended locally first and stay buffered until the server confirms them, so a
    frame lost with a connection is sent again from ``emitted + 1``.
    """

    def __init__(self, client: StreamOwner, run_id: str, emitted: int = 0):
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

"""The one check of a runner frame's JSON-RPC 2.0 envelope (SPEC §5), whatever its method.

``read`` turns a text frame into what the consumer acts on: a request to dispatch, an answer
to a command the server sent, nothing to do (a response to nothing we sent), or a refusal to
send back. Every frame goes through it once, ``run.event`` frames included, so a malformed
frame gets the same error whichever method it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from delegation.errors import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    STALE_CONNECTION,
    RpcError,
)
from delegation.protocol import MAX_FRAME_BYTES
from delegation.wire import loads_strict, refuse_nul

ENVELOPE_KEYS = frozenset({"jsonrpc", "method", "params", "id"})
RESPONSE_KEYS = frozenset({"jsonrpc", "result", "error", "id"})


@dataclass(frozen=True)
class Request:
    method: str
    params: Any
    rpc_id: Any
    has_id: bool
    # The params' own refusal (a NUL the record cannot store), answered like a method's
    # refusal: not at all to a notification.
    params_error: RpcError | None = None


@dataclass(frozen=True)
class Answer:
    """A runner's answer to a command: ``srv-<pk>`` with a result or an error."""

    command_pk: int
    result: Any
    error: Any


@dataclass(frozen=True)
class Refusal:
    rpc_id: Any
    error: RpcError


class Ignored:
    """A response to nothing the server sent: JSON-RPC forbids answering it."""


IGNORED = Ignored()


def valid_rpc_id(value) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def read(
    text_data: str | None, *, fenced: bool, methods: frozenset[str]
) -> Request | Answer | Refusal | Ignored:
    """The frame as the consumer acts on it; the checks run in the order SPEC §5 answers."""
    if text_data is None:
        return Refusal(None, RpcError(INVALID_REQUEST, "binary frames are refused"))
    if len(text_data) > MAX_FRAME_BYTES or len(text_data.encode("utf-8")) > MAX_FRAME_BYTES:
        return Refusal(
            None, RpcError(INVALID_REQUEST, f"frame too large (max {MAX_FRAME_BYTES} bytes)")
        )
    try:
        frame = loads_strict(text_data)
    except RpcError as exc:
        return Refusal(None, exc)
    if isinstance(frame, list):
        return Refusal(None, RpcError(INVALID_REQUEST, "batches are refused"))
    if not isinstance(frame, dict) or frame.get("jsonrpc") != "2.0":
        return Refusal(
            None, RpcError(INVALID_REQUEST, "not a JSON-RPC 2.0 object (jsonrpc must be '2.0')")
        )
    if "method" not in frame and "id" in frame and ("result" in frame or "error" in frame):
        return _answer(frame)
    rpc_id = frame.get("id")
    if fenced:
        # A fenced socket never takes the runner back, not even with runner.register;
        # a real runner reconnects on a new socket.
        return Refusal(
            rpc_id if valid_rpc_id(rpc_id) else None,
            RpcError(STALE_CONNECTION, "stale connection: this socket was fenced"),
        )
    unknown = set(frame) - ENVELOPE_KEYS
    if unknown:
        return Refusal(
            rpc_id if valid_rpc_id(rpc_id) else None,
            RpcError(INVALID_REQUEST, f"unknown envelope field(s): {', '.join(sorted(unknown))}"),
        )
    has_id = "id" in frame
    if has_id and not valid_rpc_id(rpc_id):
        return Refusal(None, RpcError(INVALID_REQUEST, "id must be a string or integer"))
    method = frame.get("method")
    if not isinstance(method, str):
        return Refusal(rpc_id, RpcError(INVALID_REQUEST, "method must be a string"))
    if method not in methods:
        return Refusal(rpc_id, RpcError(METHOD_NOT_FOUND, f"unknown method {method!r}"))
    params = frame.get("params", {})
    params_error = None
    if "\\u0000" in text_data:
        try:
            refuse_nul(params)
        except RpcError as exc:
            params_error = exc
    return Request(method, params, rpc_id, has_id, params_error)


def _answer(frame: dict) -> Answer | Ignored:
    rpc_id = frame.get("id")
    if set(frame) - RESPONSE_KEYS or not isinstance(rpc_id, str) or not rpc_id.startswith("srv-"):
        return IGNORED
    try:
        command_pk = int(rpc_id.removeprefix("srv-"))
    except ValueError:
        return IGNORED
    return Answer(command_pk, frame.get("result"), frame.get("error"))

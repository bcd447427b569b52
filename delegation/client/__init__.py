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
- server commands (``child.execute``, ``run.execute``, ``run.cancel``, ``run.steer``,
  ``lease.revoked``) are
  dispatched to the handlers the host registers with :meth:`RunnerClient.on`; a command the
  server redelivers after a reconnect is answered from the stored answer, not run twice.

Errors the server answers are raised as :class:`RpcError` subclasses carrying the SPEC code
(``DepthLimitReached`` is −32010, ``NotOwned`` −32003, ...).
"""

from __future__ import annotations

from delegation.client.api import RunnerClient
from delegation.client.connection import Handler, server_urls
from delegation.client.errors import (
    AdmissionRefused,
    AuthenticationFailed,
    BudgetExhausted,
    ClientClosed,
    ClientError,
    ClientTimeout,
    DepthLimitReached,
    Fenced,
    InvalidParams,
    LeaseGone,
    NoSuchRun,
    NotOwned,
    NotRegistered,
    ParentNotRunning,
    PresetStale,
    ReleaseUnconfirmed,
    RequestIdReused,
    StaleConnection,
    error_from_wire,
)
from delegation.client.joins import JoinResult
from delegation.client.shapes import (
    EmitAck,
    Event,
    ExecuteCommand,
    Extension,
    Identity,
    McpToken,
    Preset,
    Registration,
    Result,
    SteerOutcome,
)
from delegation.client.streams import (
    BATCH_BYTES,
    BATCH_EVENTS,
    EVENT_FIELDS,
    MAX_EVENT_BYTES,
    RunStream,
    _check_event,
    event,
)
from delegation.errors import RpcError

__all__ = [
    "AdmissionRefused",
    "AuthenticationFailed",
    "BudgetExhausted",
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
    "JoinResult",
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
    "server_urls",
]

# Importable from here as before the split, though outside ``import *``.
_REEXPORTED = (
    BATCH_BYTES,
    BATCH_EVENTS,
    EVENT_FIELDS,
    MAX_EVENT_BYTES,
    Handler,
    McpToken,
    _check_event,
    error_from_wire,
)

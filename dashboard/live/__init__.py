"""The live socket for operators, ``/ws/live/`` (SPEC §7).

Modules: ``frames`` (the frames in and out, parsed strictly), ``gate`` (Origin, session and
bearer-token checks), ``consumer`` (the ASGI handler: handshake, frames in, doorbells in),
``connection`` (one socket's state and its worker: sends, heartbeats, re-auth), one module per
subscription kind (``runs``, ``trees``, ``overview``, ``runners``, ``approvals``), ``caps`` (limits per user
and socket), ``read_cache`` (reads shared by the sockets of a process) and ``backpressure``
(pausing for a client that stopped reading). Reads come from ``delegation.selectors``; close
codes and bearer parsing from ``delegation.protocol``.

Authentication: the browser's Django session (the handshake's ``Origin`` must be exactly
the server's own origin - scheme, host and port of the request - or one of
``CSRF_TRUSTED_ORIGINS``), or ``Authorization: Bearer <api token>`` for scripts (a browser
cannot set that header, so a token handshake needs no Origin; one that sends an Origin still
has it checked). The user needs the viewer role at least. Refusals close the socket right
after the handshake with 4401 (not signed in / bad token) or 4403 (no role); a user over
``LIVE_MAX_SOCKETS_PER_USER`` gets an ``error`` frame (code ``limit``) and 4429. Every
heartbeat re-checks the credential and closes with 4401 (logged out, session expired,
password changed, user deactivated, token revoked or expired) or 4403 (no role any more).

Protocol. One JSON object per text frame, decoded strictly (unknown fields, duplicate keys,
wrong types and nulls are refused; the error names the field). Client to server:

``{"type": "subscribe", "runId": R, "after": N}``
    The run's events with ``sequence > N`` (``after`` defaults to 0), replayed from the
    database, then pushed as they commit; plus the run's state whenever it changes.
``{"type": "subscribe", "treeId": R}``
    The subtree under run R (the whole tree when R is a root): every run of it as a row,
    in chunks (``tree`` frames, the last with ``"more": false``), then a ``rows`` frame for
    each run that appears or changes (status, event count, lease, refused spawns, ...).
    Resubscribing resends the whole snapshot; rows are upserts keyed by ``runId``.
``{"type": "subscribe", "roots": [R, ...], "newTrees": true}``
    For the trees overview (at most ``LIVE_MAX_ROOT_SUBSCRIPTIONS`` roots per socket across
    frames; more is refused with an ``error`` frame, code ``limit``): a ``summary`` frame per root (counts by status, deepest depth,
    number of runs) now and whenever the tree changes, and with ``newTrees`` a ``newTree``
    frame whenever a top-level run opens.
``{"type": "subscribe", "runners": true}``
    ``runners`` frames with every runner's connection state, now and on every change.
``{"type": "subscribe", "approvals": true}``
    For the approvals inbox (any viewer): an ``approvals`` frame (``pending``, the number of
    approvals waiting) now and after every request, decision or expiry commits; the client
    reads the list through ``GET /api/approvals``.
``{"type": "unsubscribe", ...}``
    The same keys as the subscription to drop (``runId``, ``treeId``, ``roots``,
    ``runners``, ``approvals``).
``{"type": "ping"}``
    Answered by ``{"type": "pong"}``.

Server to client: ``hello`` (once: heartbeat period, server time, user and role),
``subscribed``, ``run`` (a run's ``Result`` fields without events, plus times and head),
``events`` (``runId`` and a list of events in sequence order, each with ``actor`` and
``createdAt``), ``tree``, ``rows``, ``summary``, ``newTree``, ``runners``, ``approvals``, ``heartbeat`` and
``error`` (``code``, ``field``, ``message``).

Delivery. The database is the record and the channel layer only rings a doorbell (which
may be lost). On every doorbell, and for every subscription on every heartbeat, the socket
reads from the database everything after what it has already sent on this connection, so
the events of a run arrive gap-free, duplicate-free and in sequence order whatever the
channel layer dropped. All reads and sends happen in one worker task per socket, so frames
never interleave. Every ``LIVE_HEARTBEAT_SECONDS`` (the first at a random point between a
half and one period after ``hello``, so sockets opened together beat apart) the server
catches up and then sends
``{"type": "heartbeat", "at": ms, "runs": {runId: lastSentSequence}, "trees": {...}}``: a
client whose last sequence for a run is below the head missed frames and resubscribes with
``after`` = its last sequence; a client that hears nothing for a few heartbeat periods
treats the socket as dead and reconnects the same way. A client that reconnects with its
last sequence loses nothing.
"""

from dashboard.live.consumer import LiveConsumer
from dashboard.live.gate import LiveGate


def live_application():
    return LiveGate(LiveConsumer.as_asgi())

"""Back-pressure: how much a client has not taken yet, and waiting until it has.

Nothing pushes back through ASGI: without a check, every frame for a client that stopped
reading would pile up in this process. A socket whose backlog passes
``LIVE_MAX_BACKLOG_BYTES`` pauses (``Backlogged``) and resumes once the client has taken
half of it. ``canopy.backpressure`` paces streamed HTTP responses with ``unsent_bytes`` too.
"""

from __future__ import annotations

import asyncio
import functools

from django.conf import settings

DRAIN_POLL_SECONDS = 0.05
# Frames a backlogged socket still owes its client (pongs, errors), sent once it drains.
MAX_OWED_REPLIES = 32


class Backlogged(Exception):
    """The client has not taken what was already sent; send nothing more for now."""


def unsent_bytes(send) -> int | None:
    """Bytes written to this socket that the client has not taken yet, where daphne lets us
    see it: its ASGI ``send`` is ``partial(handle_reply, protocol)`` over a Twisted
    transport. None under any other server (the test communicator), where no check is made.
    """
    protocol = send.args[0] if isinstance(send, functools.partial) and send.args else None
    transport = getattr(protocol, "transport", None)
    if transport is None or not hasattr(transport, "dataBuffer"):
        return None
    return (
        len(transport.dataBuffer)
        - getattr(transport, "offset", 0)
        + getattr(transport, "_tempDataLen", 0)
    )


def over_limit(send) -> int | None:
    """The backlog when it is past ``LIVE_MAX_BACKLOG_BYTES``, else None."""
    backlog = unsent_bytes(send)
    if backlog is not None and backlog > settings.LIVE_MAX_BACKLOG_BYTES:
        return backlog
    return None


def _half_drained(send) -> bool:
    backlog = unsent_bytes(send)
    return backlog is None or backlog <= settings.LIVE_MAX_BACKLOG_BYTES // 2


async def until_half_drained(send) -> None:
    """Return at once if the client has taken half of the limit, else once it has."""
    while not _half_drained(send):
        await asyncio.sleep(DRAIN_POLL_SECONDS)


async def after_half_drained(send) -> None:
    """Wait a poll first (a socket that just paused has not drained), then until drained."""
    while True:
        await asyncio.sleep(DRAIN_POLL_SECONDS)
        if _half_drained(send):
            return

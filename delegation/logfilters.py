"""Ordinary events stay one line in the server log (issue 25).

A refused request (403, 404), a browser that navigated away while its live socket caught up,
a child torn down after ignoring its cancel: each is something that happens every day, not a
bug, and a full traceback for it buries the ones that are. :class:`OrdinaryEvents` keeps the
record and its message, adds the exception's type and text to the line, and drops the
traceback. Everything else (a 500, an unexpected error) keeps its traceback.
"""

from __future__ import annotations

import asyncio
import logging

# The peer went away: nothing on this side failed.
GONE = (
    ConnectionResetError,
    BrokenPipeError,
    ConnectionAbortedError,
    asyncio.CancelledError,
)
GONE_NAMES = frozenset(
    {
        "ConnectionClosed",
        "ConnectionClosedOK",
        "ConnectionClosedError",
        "Disconnected",
        "ClientDisconnected",
        "ClientClosed",
        "Closed",
        "RequestAborted",
    }
)


def ordinary(record: logging.LogRecord) -> bool:
    status = getattr(record, "status_code", None)
    if isinstance(status, int) and status < 500:
        return True
    exc = record.exc_info[1] if record.exc_info else None
    if exc is None:
        return False
    return isinstance(exc, GONE) or type(exc).__name__ in GONE_NAMES


class OrdinaryEvents(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and ordinary(record):
            exc = record.exc_info[1]
            if exc is not None:
                text = str(exc).splitlines()[0] if str(exc) else ""
                record.msg = (
                    f"{record.getMessage()} ({type(exc).__name__}{': ' if text else ''}{text})"
                )
                record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True

"""Warnings that stay readable under faults: a repeated warning is logged once, then counted.

During a Redis outage every lost doorbell would otherwise be a line of its own (about 2,000 in
10 s). :class:`RateLimitedLog` logs the first occurrence of a kind at once, counts the ones that
follow within ``window`` seconds, and logs one line per window for them::

    doorbell lost ×1,874 in 10 s (last: doorbell to run-42 lost (Connection refused))

A kind that stops recurring costs nothing after its last summary. Pure standard library, so
any module may use it; safe to call from threads and from the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Window:
    ends: float
    suppressed: int = 0
    last: str = ""
    level: int = logging.WARNING
    flush_scheduled: bool = False


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        window: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.logger = logger
        self.window = window
        self.clock = clock
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def warning(self, kind: str, message: str, *args) -> None:
        self.log(logging.WARNING, kind, message, *args)

    def log(self, level: int, kind: str, message: str, *args) -> None:
        """Log ``message % args`` now if ``kind`` is quiet; otherwise count it for the summary."""
        now = self.clock()
        with self._lock:
            summary = self._close_if_over(kind, now)
            current = self._windows.get(kind)
            if current is None:
                self._windows[kind] = _Window(ends=now + self.window)
                first = True
            else:
                current.suppressed += 1
                current.last = message % args if args else message
                current.level = level
                first = False
                schedule = not current.flush_scheduled
                current.flush_scheduled = True
        if summary is not None:
            self.logger.log(*summary)
        if first:
            self.logger.log(level, message, *args)
        elif schedule:
            self._schedule_flush(kind, current.ends - now)

    def flush(self, kind: str | None = None) -> None:
        """Log the summary of every window (or ``kind``'s) that is over."""
        now = self.clock()
        with self._lock:
            kinds = [kind] if kind is not None else list(self._windows)
            summaries = [self._close_if_over(k, now) for k in kinds]
        for summary in summaries:
            if summary is not None:
                self.logger.log(*summary)

    def _close_if_over(self, kind: str, now: float):
        """End ``kind``'s window if it is over: its summary, if it counted any (and a new
        window opens, so a fault that goes on is summarised once per window again)."""
        current = self._windows.get(kind)
        if current is None or now < current.ends:
            return None
        if current.suppressed == 0:
            del self._windows[kind]
            return None
        self._windows[kind] = _Window(ends=now + self.window)
        return (
            current.level,
            "%s ×%s in %s s (last: %s)",
            kind,
            f"{current.suppressed:,}",
            f"{self.window:g}",
            current.last,
        )

    def _schedule_flush(self, kind: str, delay: float) -> None:
        # On the event loop the summary goes out when the window ends even if the fault does
        # not recur; elsewhere it waits for the next occurrence or an explicit flush().
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.call_later(max(delay, 0), self._flush_scheduled, kind)

    def _flush_scheduled(self, kind: str) -> None:
        now = self.clock()
        with self._lock:
            current = self._windows.get(kind)
            if current is None:
                return
            early = current.ends - now if now < current.ends else None
            if early is None:
                current.flush_scheduled = False
        if early is not None:  # the loop's clock ran ahead of ours: wait for the rest
            self._schedule_flush(kind, early)
            return
        self.flush(kind)

"""Reads shared between the sockets of one process.

Sockets of one process watching the same run from the same point share one database read:
twenty watchers woken by one doorbell cost one query, not twenty. The key holds the highest
sequence a doorbell has announced, so a read joined later was started after that commit.
"""

from __future__ import annotations

import asyncio

from delegation import metrics, selectors
from delegation.database_threads import hot_database_call


def read_off_thread(function):
    """``function`` run in a thread of its own, not the shared sync thread: long reads (a
    100k-run snapshot) must not queue other sockets' handshakes and the pages' views."""
    return hot_database_call(function, thread_sensitive=False)


def _run_delta(run_pk: int, after: int, limit: int):
    metrics.LIVE_READS.inc()
    state = selectors.live_run_state(run_pk)
    if state is None:
        return None, []
    return state, selectors.live_events_page(run_pk, after, limit)


_heads: dict[int, int] = {}
_inflight: dict[tuple, asyncio.Future] = {}
_read_delta = read_off_thread(_run_delta)


def note_head(run_pk, sequence) -> None:
    """Remember the highest sequence a doorbell announced for the run."""
    if isinstance(run_pk, int) and isinstance(sequence, int):
        if sequence > _heads.get(run_pk, 0):
            _heads[run_pk] = sequence


async def shared_run_delta(run_pk: int, after: int, limit: int):
    """The run's state and up to ``limit`` events after ``after``, read once per process."""
    key = (run_pk, after, limit, _heads.get(run_pk, 0))
    future = _inflight.get(key)
    if future is None or future.get_loop() is not asyncio.get_running_loop():
        future = asyncio.ensure_future(_read_delta(run_pk, after, limit))
        _inflight[key] = future
        future.add_done_callback(lambda _done, key=key: _inflight.pop(key, None))
    return await asyncio.shield(future)

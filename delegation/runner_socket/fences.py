"""Every registered runner socket of this process, checked against the database twice a
second: a revoked or rotated credential, or a registration another process took over, closes
the socket within a second even when the channel-layer message that says so is lost (Redis
down, or a revocation from a process on another layer, such as ``manage.py runner_token``).

One query per tick for all of the process's sockets, and none while it has no socket. The
message on the runner's group (``runners.fence_runner``) still closes the socket at once, after
the same read (``recheck``); this is the guarantee behind it.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async

from delegation import selectors

log = logging.getLogger(__name__)

CHECK_SECONDS = 0.5

# Per event loop (one under daphne; one per test in the suite): its sockets and its task.
_watches: dict[asyncio.AbstractEventLoop, tuple[set, asyncio.Task]] = {}


def watch(consumer) -> None:
    """Check ``consumer`` (a registered ``RunnerSocketConsumer``) from now on, until ``forget``."""
    loop = asyncio.get_running_loop()
    watched = _watches.get(loop)
    if watched is None or watched[1].done():
        sockets: set = set()
        watched = (sockets, loop.create_task(_keep_checking(loop, sockets)))
        _watches[loop] = watched
    watched[0].add(consumer)


def forget(consumer) -> None:
    for sockets, _task in list(_watches.values()):
        sockets.discard(consumer)


async def _keep_checking(loop, sockets: set) -> None:
    try:
        while sockets:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                await check(sockets)
            except Exception:  # the database is away: the next tick tries again
                log.warning("runner socket fence check failed", exc_info=True)
    finally:
        if _watches.get(loop, (None, None))[0] is sockets:
            del _watches[loop]


async def check(sockets: set) -> None:
    """Close every socket whose runner's credential or registration moved on."""
    # The connection as it was when the read began: a register that commits meanwhile
    # replaces the consumer's connection, and that socket is left for the next tick.
    seen = [(c, c.conn) for c in list(sockets) if c.conn is not None and c.conn.generation]
    if not seen:
        return
    states = await database_sync_to_async(selectors.fence_states)(
        {conn.runner_pk for _c, conn in seen}
    )
    for consumer, conn in seen:
        if consumer.conn is not conn or consumer.fenced:
            continue
        await _close_if_moved_on(consumer, conn, states.get(conn.runner_pk))


async def recheck(consumer) -> None:
    """What a ``runner.fenced`` / ``runner.revoked`` message makes a socket do: read the record
    and close it only if the record says so. The message is a doorbell (SPEC §13): anyone who
    can write to Redis could have sent it."""
    conn = consumer.conn
    if conn is None or consumer.fenced:
        return
    states = await database_sync_to_async(selectors.fence_states)({conn.runner_pk})
    if consumer.conn is conn and not consumer.fenced:
        await _close_if_moved_on(consumer, conn, states.get(conn.runner_pk))


async def _close_if_moved_on(consumer, conn, state) -> None:
    """``state``: (connection generation, revoked, token hash) of the runner, or None."""
    if state is None or state[1] or (conn.credential and state[2] != conn.credential):
        await consumer.close_revoked()
    elif conn.generation and state[0] != conn.generation:
        await consumer.close_fenced()

"""Every registered runner socket of this process, checked against the database twice a
second: a revoked or rotated credential, or a registration another process took over, closes
the socket within a second even when the channel-layer message that says so is lost (Redis
down, or a revocation from a process on another layer, such as ``manage.py runner_token``).

One query per tick for all of the process's sockets, and none while it has no socket. The
message on the runner's group (``runners.fence_runner``) still closes the socket at once; this
is the guarantee behind it.
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
    """Check ``consumer`` (a registered ``RunnerConsumer``) from now on, until ``forget``."""
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
        state = states.get(conn.runner_pk)
        if state is None or state[1] or (conn.credential and state[2] != conn.credential):
            await consumer.runner_revoked({"why": "runner token revoked or rotated"})
        elif state[0] != conn.generation:
            await consumer.runner_fenced({})

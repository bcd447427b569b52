"""Every live socket of this process, its credential checked against the database twice a
second (SPEC §11, issue 35: authority ends at revocation, within a second, not at the next
heartbeat): a revoked or expired API token, or a deactivated user, closes the socket.

One query per kind of credential per tick for all of the process's sockets, none while it has
none; it reads the record, so a revocation from any process (the admin, REST, ``manage.py``)
counts, whatever the channel layer. What lapsed is handed to the socket's own full re-check
(``gate.recheck``, the heartbeat's), which closes it with 4401 or 4403.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async

from dashboard.live.gate import lapsed

log = logging.getLogger(__name__)

CHECK_SECONDS = 0.5

# Per event loop (one under daphne; one per test in the suite): its connections and its task.
_watches: dict[asyncio.AbstractEventLoop, tuple[set, asyncio.Task]] = {}


def watch(connection) -> None:
    loop = asyncio.get_running_loop()
    watched = _watches.get(loop)
    if watched is None or watched[1].done():
        connections: set = set()
        watched = (connections, loop.create_task(_keep_checking(loop, connections)))
        _watches[loop] = watched
    watched[0].add(connection)


def forget(connection) -> None:
    for connections, _task in list(_watches.values()):
        connections.discard(connection)


async def _keep_checking(loop, connections: set) -> None:
    try:
        while connections:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                await check(connections)
            except Exception:  # the database is away: the next tick tries again
                log.warning("live socket credential check failed", exc_info=True)
    finally:
        if _watches.get(loop, (None, None))[0] is connections:
            del _watches[loop]


async def check(connections: set) -> None:
    seen = list(connections)
    if not seen:
        return
    ended = await database_sync_to_async(lapsed)([(c.user.pk, c.token) for c in seen])
    for index in ended:
        connection = seen[index]
        connections.discard(connection)
        connection.schedule(connection.end_if_unauthorised)

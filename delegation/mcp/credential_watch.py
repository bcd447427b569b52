"""Every MCP call of this process that waits under a run token, checked against the database
twice a second (SPEC §11: authority ends at revocation, within a second).

The message on the runner's credentials group (``notify.runner_fenced``) wakes a waiting call
at once; this is the guarantee behind it when that message cannot arrive: the embedded
in-memory layer reaches no other process (``manage.py runner_token rotate`` is one), and
Redis may be away. One query per tick for all of the process's waiting calls, none while no
call waits. A change it sees is sent to the waiting call's own channel as the same doorbell;
the call then authenticates again and ends with −32001.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async

from delegation import selectors

log = logging.getLogger(__name__)

CHECK_SECONDS = 0.5

# Per event loop: {channel: (runner pk, the runner token hash its run token was issued under)}.
_watches: dict[asyncio.AbstractEventLoop, tuple[dict, asyncio.Task]] = {}


def watch(layer, channel: str, runner_pk: int, token_hash: str) -> None:
    loop = asyncio.get_running_loop()
    watched = _watches.get(loop)
    if watched is None or watched[1].done():
        waiting: dict = {}
        watched = (waiting, loop.create_task(_keep_checking(loop, layer, waiting)))
        _watches[loop] = watched
    watched[0][channel] = (runner_pk, token_hash)


def forget(channel: str) -> None:
    for waiting, _task in list(_watches.values()):
        waiting.pop(channel, None)


async def _keep_checking(loop, layer, waiting: dict) -> None:
    try:
        while waiting:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                await check(layer, waiting)
            except Exception:  # the database is away: the next tick tries again
                log.warning("waiting MCP call credential check failed", exc_info=True)
    finally:
        if _watches.get(loop, (None, None))[0] is waiting:
            del _watches[loop]


async def check(layer, waiting: dict) -> None:
    seen = dict(waiting)
    if not seen:
        return
    states = await database_sync_to_async(selectors.fence_states)(
        {runner_pk for runner_pk, _hash in seen.values()}
    )
    for channel, (runner_pk, token_hash) in seen.items():
        state = states.get(runner_pk)  # (connection generation, revoked, token hash)
        if state is None or state[1] or state[2] != token_hash:
            waiting.pop(channel, None)  # one ring: the call's own read ends it
            await layer.send(channel, {"type": "credentials.changed"})

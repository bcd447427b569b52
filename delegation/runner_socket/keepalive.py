"""One keep-alive for every runner socket of a process (issue 39): "seen" and the outbox poll.

Doorbells can be lost, so a runner socket polls its outbox; and the silent-runner sweep needs
each registered runner touched every ``OUTBOX_RESEND_SECONDS``. Each socket used to do both on
its own timer: two database calls (a touch, and a claim of three statements) per socket per
5 s. At 1,000 sockets that was 400 calls a second on two processes' thread pools, queued
(43–180 deep) in front of the group commit of ``run.event`` frames; profiled in the
1,000-socket step, the claims and touches took 44 % of the servers' samples and the commits 7 %.

Now one task per process does it for all of them, per tick: one ``UPDATE`` touching every
registered runner of the process (once per ``OUTBOX_RESEND_SECONDS``), one read of which of them
have a command to send (``selectors.runners_with_unsent``), and a claim only for those. The
tick is ``OUTBOX_RESEND_SECONDS`` while the channel layer works and ``DEGRADED_POLL_SECONDS``
while it loses doorbells and for a while after, as the per-socket poll's was; every tick also
joins each socket's runner group again (a restarted Redis forgot them).

``RUNNER_KEEPALIVE=socket`` keeps the per-socket timers, for the benchmark to measure against.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from channels.layers import get_channel_layer
from django.conf import settings

from delegation import selectors
from delegation.layers import recently_faulted, until_faulted
from delegation.runner_socket.database_calls import on_database
from delegation.services import runners

log = logging.getLogger(__name__)

# The outbox poll while the channel layer loses doorbells.
DEGRADED_POLL_SECONDS = 0.25

# Per event loop (one under daphne; one per test in the suite): its sockets and its task.
_watches: dict[asyncio.AbstractEventLoop, tuple[set, asyncio.Task]] = {}


def per_process() -> bool:
    return settings.RUNNER_KEEPALIVE == "process"


def watch(consumer) -> None:
    """Keep ``consumer`` (a connected ``RunnerConsumer``) alive from now on, until ``forget``."""
    loop = asyncio.get_running_loop()
    watched = _watches.get(loop)
    if watched is None or watched[1].done():
        sockets: set = set()
        watched = (sockets, loop.create_task(_keep_alive(loop, sockets)))
        _watches[loop] = watched
    watched[0].add(consumer)


def forget(consumer) -> None:
    for sockets, _task in list(_watches.values()):
        sockets.discard(consumer)


async def per_socket(consumer) -> None:
    """The keep-alive of one socket on its own timer (``RUNNER_KEEPALIVE=socket``): a touch
    and an outbox claim per socket per tick, as before issue 39."""
    resend = settings.OUTBOX_RESEND_SECONDS
    tick = min(resend, DEGRADED_POLL_SECONDS)
    touched = time.monotonic()
    while True:
        if recently_faulted(consumer.channel_layer, within=2 * resend):
            await asyncio.sleep(tick)
        else:
            await until_faulted(consumer.channel_layer, timeout=resend)
        if consumer.conn is not None and consumer.conn.generation:
            with contextlib.suppress(Exception):
                if time.monotonic() - touched >= resend:
                    await on_database(runners.touch_runner)(consumer.conn)
                    touched = time.monotonic()
                await consumer._flush_outbox()
        if consumer.runner_group:
            await consumer.channel_layer.group_add(consumer.runner_group, consumer.channel_name)


def _touch_and_check(conns: list, touch: bool) -> set[int]:
    if touch:
        runners.touch_runners(conns)
    return selectors.runners_with_unsent(conns)


async def _keep_alive(loop, sockets: set) -> None:
    layer = get_channel_layer()
    resend = settings.OUTBOX_RESEND_SECONDS
    tick = min(resend, DEGRADED_POLL_SECONDS)
    touched = time.monotonic()
    try:
        while sockets:
            # Healthy, one wake-up per `resend` (at once on a fault), not one per tick.
            if recently_faulted(layer, within=2 * resend):
                await asyncio.sleep(tick)
            else:
                await until_faulted(layer, timeout=resend)
            # "Seen" needs no more than one write per `resend`, even polling fast.
            touch = time.monotonic() - touched >= resend
            try:
                await sweep(sockets, touch=touch)
            except Exception:  # the database is away: the next tick tries again
                log.warning("runner socket keep-alive failed", exc_info=True)
            if touch:
                touched = time.monotonic()
            await _join_again(sockets)
    finally:
        if _watches.get(loop, (None, None))[0] is sockets:
            del _watches[loop]


async def sweep(sockets: set, *, touch: bool) -> None:
    """Touch the registered sockets' runners (with ``touch``) and flush the outbox of those
    that have a command to send."""
    live = [
        (c, c.conn)
        for c in list(sockets)
        if c.conn is not None and c.conn.generation and not c.fenced
    ]
    if not live:
        return
    due = await on_database(_touch_and_check)([conn for _c, conn in live], touch)
    for consumer, conn in live:
        # Not a socket that closed meanwhile: its claim would mark commands sent that no
        # runner got (they go again only after a new registration).
        if conn.runner_pk in due and consumer.conn is conn and consumer in sockets:
            consumer._spawn(consumer._flush_outbox())


async def _join_again(sockets: set) -> None:
    """A Redis restart forgets group memberships: every socket joins its runner's again."""
    for consumer in list(sockets):
        if consumer.runner_group:
            with contextlib.suppress(Exception):
                await consumer.channel_layer.group_add(consumer.runner_group, consumer.channel_name)

"""One subscription per process, not per socket: the fan-out of doorbells to local watchers.

Every live socket of a process that follows a run, a tree, the overview or the runners is
held here under the channel group it needs, and the process (one hub per event loop, so one
per daphne process) joins each group once, on one channel of its own. A doorbell therefore
costs one channel-layer message per process whatever the number of watchers: twenty
watchers of a run on one process are one Redis ``ZADD`` and one receive, not twenty. The hub
hands each message to every local socket that holds its group; each socket's worker then
reads what it lacks (through ``read_cache``, shared by the process) or pushes what the
doorbell carried, exactly as before, so a lost message still only delays a catch-up.

Why a group per process and not channels-redis's pub/sub layer: the bench measured both
(docs/explanation/live-capacity.md). The pub/sub layer also sends one message per process,
but it is a second layer to configure, it keeps no per-channel capacity (a slow process
gets everything, the sorted-set layer sheds), and this needs no change to the layer the
runner sockets and MCP waits already use.

A Redis restart forgets every membership: the hub joins its groups again every
``LIVE_HEARTBEAT_SECONDS``, and the sockets' heartbeats catch up what was rung meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref

from django.conf import settings

from delegation import metrics, notify
from delegation.layers import rung_in_process

log = logging.getLogger(__name__)


class Hub:
    def __init__(self, layer):
        self.layer = layer
        self.channel: str | None = None
        self.members: dict[str, set] = {}
        self.tasks: list[asyncio.Task] = []
        self.received = 0  # messages this process took off the layer (the bench reads it)

    async def hold(self, group: str, connection) -> None:
        if self.channel is None:
            # The default prefix: channels-redis receives every "specific." channel of a process
            # through one shared BZPOPMIN; another prefix would compete with it for the lock.
            self.channel = await self.layer.new_channel()
            notify.listen_in_process(self)
        if not self.tasks:
            self.tasks = [
                asyncio.ensure_future(self._listen()),
                asyncio.ensure_future(self._rejoin()),
            ]
        members = self.members.setdefault(group, set())
        members.add(connection)
        if len(members) == 1:
            await self.layer.group_add(group, self.channel)

    async def release(self, group: str, connection) -> None:
        members = self.members.get(group)
        if members is None:
            return
        members.discard(connection)
        if members:
            return
        del self.members[group]
        with contextlib.suppress(Exception):
            await self.layer.group_discard(group, self.channel)
        if group in self.members:
            # Held again while the discard was on its way: it must not win.
            await self.layer.group_add(group, self.channel)
        if not self.members:
            # Nobody local watches anything: stop listening (a test's event loop can end).
            for task in self.tasks:
                task.cancel()
            self.tasks = []

    def watchers(self, message: dict) -> set:
        group = message.get("group")
        if group is not None:
            return set(self.members.get(group, ()))
        # A ring without its group (an older process): everyone it may concern.
        if message.get("type") == "runner.changed":
            return set(self.members.get(notify.RUNNERS_GROUP, ()))
        if message.get("type") == "approvals.changed":
            return set(self.members.get(notify.APPROVALS_GROUP, ()))
        found = set()
        for name in (
            notify.run_group(message.get("run")),
            notify.tree_group(message.get("root")),
            notify.TREES_GROUP,
        ):
            found |= self.members.get(name, set())
        return found

    def deliver(self, message: dict) -> None:
        kind = message.get("type")
        for connection in self.watchers(message):
            if kind == "run.changed":
                connection.ring_run(message)
            elif kind == "runner.changed":
                connection.ring_runners()
            elif kind == "approvals.changed":
                connection.ring_approvals()

    def ring_here(self, messages: list[tuple[str, dict]]) -> None:
        """Doorbells this process committed, rung without the layer (``notify``): the
        layer skips this hub's channel, so each reaches it once."""
        for group, message in messages:
            if group not in self.members:
                continue
            self.received += 1
            metrics.LIVE_DOORBELLS.inc()
            try:
                self.deliver(rung_in_process(message))
            except Exception:
                log.exception("live hub: a doorbell could not be delivered")

    async def _listen(self):
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # the resilient layer retries itself; any other layer: pause
                log.warning("live hub: receive failed", exc_info=True)
                await asyncio.sleep(0.5)
                continue
            self.received += 1
            metrics.LIVE_DOORBELLS.inc()
            try:
                self.deliver(message)
            except Exception:
                log.exception("live hub: a doorbell could not be delivered")

    async def _rejoin(self):
        while True:
            await asyncio.sleep(float(settings.LIVE_HEARTBEAT_SECONDS))
            for group in list(self.members):
                await self.layer.group_add(group, self.channel)


_hubs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class PerSocket:
    """``LIVE_FANOUT=socket``: each socket joins its groups on its own channel, as before the
    hub (one message per watcher); kept to measure against, and as a way back."""

    def __init__(self, layer):
        self.layer = layer

    async def hold(self, group: str, connection) -> None:
        await self.layer.group_add(group, connection.socket.channel_name)

    async def release(self, group: str, connection) -> None:
        with contextlib.suppress(Exception):
            await self.layer.group_discard(group, connection.socket.channel_name)


def hub_for(layer) -> Hub | PerSocket:
    if settings.LIVE_FANOUT == "socket":
        return PerSocket(layer)
    """This event loop's hub on ``layer`` (a daphne process has one loop)."""
    loop = asyncio.get_running_loop()
    hubs = _hubs.setdefault(loop, {})
    hub = hubs.get(id(layer))
    if hub is None or hub.layer is not layer:
        hub = hubs[id(layer)] = Hub(layer)
    return hub

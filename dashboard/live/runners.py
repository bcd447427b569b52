"""The runners subscription: ``{"type": "subscribe", "runners": true}``.

A ``runners`` frame with every runner's connection state, now and on every change.
"""

from __future__ import annotations

from channels.db import database_sync_to_async

from dashboard.live.frames import SubscribeRunners, Unsubscribe
from delegation import notify, selectors


class RunnerSubscription:
    def __init__(self, connection):
        self.connection = connection
        self.active = False
        self.state = None
        self.dirty = False

    async def subscribe(self, frame: SubscribeRunners):
        self.active = True
        self.state = None
        await self.connection.hold(notify.RUNNERS_GROUP)
        await self.connection.send({"type": "subscribed", "runners": True})
        await self.catch_up_all()

    async def unsubscribe(self, frame: Unsubscribe):
        if frame.runners:
            self.active = False
            await self.connection.release(notify.RUNNERS_GROUP)

    def ring(self) -> bool:
        """A runner-changed doorbell; True when this socket follows runners."""
        if self.active:
            self.dirty = True
        return self.active

    async def catch_up_dirty(self):
        if self.dirty:
            self.dirty = False
            await self.catch_up_all()

    async def catch_up_all(self):
        if not self.active:
            return
        rows = await database_sync_to_async(selectors.runner_states)()
        if rows != self.state:
            self.state = rows
            await self.connection.send({"type": "runners", "runners": rows})

    def forget_sent(self):
        self.state = None

"""The approvals subscription: ``{"type": "subscribe", "approvals": true}``.

An ``approvals`` frame (``pending``: how many approvals wait, across trees) now and whenever
an approval is requested, decided or expired: a doorbell for the inbox, which reads the list
itself through ``GET /api/approvals`` (the record, and the one place that shapes what a user
may see). Any signed-in viewer may subscribe: the frame carries no approval content. Rings
between two passes of the worker are coalesced into one frame; the heartbeat sends one only
when the count changed (a lost ring is caught up there).
"""

from __future__ import annotations

from channels.db import database_sync_to_async

from dashboard.live.frames import SubscribeApprovals, Unsubscribe
from delegation import notify
from delegation.selectors.approvals import pending_count


class ApprovalSubscription:
    def __init__(self, connection):
        self.connection = connection
        self.active = False
        self.sent: int | None = None
        self.dirty = False

    async def subscribe(self, frame: SubscribeApprovals):
        if not self.active:
            await self.connection.hold(notify.APPROVALS_GROUP)
        self.active = True
        await self.connection.send({"type": "subscribed", "approvals": True})
        # A (re)subscription always rings once: the client catches up from the database.
        await self._send()

    async def unsubscribe(self, frame: Unsubscribe):
        if frame.approvals and self.active:
            self.active = False
            self.dirty = False
            await self.connection.release(notify.APPROVALS_GROUP)

    def ring(self) -> bool:
        """An approvals doorbell; True when this socket follows approvals."""
        if self.active:
            self.dirty = True
        return self.active

    async def catch_up_dirty(self):
        if self.dirty:
            self.dirty = False
            await self._send()

    async def catch_up_all(self):
        # The heartbeat: only a changed count rings (the doorbell itself may have been lost).
        if self.active:
            count = await database_sync_to_async(pending_count)()
            if count != self.sent:
                await self._send(count)

    def forget_sent(self):
        self.sent = None

    async def _send(self, count: int | None = None):
        if not self.active:
            return
        if count is None:
            count = await database_sync_to_async(pending_count)()
        self.sent = count
        await self.connection.send({"type": "approvals", "pending": count})

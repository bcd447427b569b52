"""One live socket's state apart from the handler that speaks ASGI (Zulip's
``ClientDescriptor``): who it is, what it follows, and the one worker that reads and sends.

All reads and sends happen in one worker task per socket, so frames never interleave: client
frames and doorbells only queue work (``schedule``, ``ring_*``) and wake the worker. Every
``LIVE_HEARTBEAT_SECONDS`` the worker re-checks the credential, catches every subscription
up from the database and sends a ``heartbeat`` with the heads sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

from channels.db import database_sync_to_async

from dashboard.live import backpressure, credential_watch
from dashboard.live.approvals import ApprovalSubscription
from dashboard.live.backpressure import MAX_OWED_REPLIES, Backlogged
from dashboard.live.frames import (
    SubscribeApprovals,
    SubscribeRoots,
    SubscribeRun,
    SubscribeTree,
    Unsubscribe,
)
from dashboard.live.gate import recheck
from dashboard.live.hub import hub_for
from dashboard.live.overview import RootSubscriptions
from dashboard.live.read_cache import note_head
from dashboard.live.runners import RunnerSubscription
from dashboard.live.runs import RunSubscriptions
from dashboard.live.trees import TreeSubscriptions
from delegation.wire import dumps

log = logging.getLogger(__name__)


class Closed(Exception):
    """The socket was closed by the server; the worker stops."""


class Connection:
    """``socket`` is the consumer: its ``send``, ``close``, ``channel_layer``,
    ``channel_name`` and ``base_send`` (for the backlog) are all this uses of it."""

    def __init__(self, socket, *, user, session_key, token, heartbeat_seconds: float):
        self.socket = socket
        # What the heartbeat re-checks: the credential this socket was opened with.
        self.user = user
        self.session_key = session_key
        self.token = token
        self.heartbeat_seconds = heartbeat_seconds
        self.runs = RunSubscriptions(self)
        self.trees = TreeSubscriptions(self)
        self.roots = RootSubscriptions(self)
        self.runners = RunnerSubscription(self)
        self.approvals = ApprovalSubscription(self)
        # Caught up in this order on every pass of the worker; runners and approvals after it.
        self.streams = (self.runs, self.trees, self.roots)
        self.groups_held: dict[str, int] = {}
        self.jobs: list = []
        self.wake = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.owed: list[dict] = []
        self.backlogged = False

    def start(self):
        self.tasks.append(asyncio.ensure_future(self._work()))
        self.tasks.append(asyncio.ensure_future(self._beat()))
        credential_watch.watch(self)

    async def stop(self):
        credential_watch.forget(self)
        for task in self.tasks:
            task.cancel()
        hub = hub_for(self.socket.channel_layer)
        for group in list(self.groups_held):
            self.groups_held.pop(group, None)
            with contextlib.suppress(Exception):
                await hub.release(group, self)

    # --- work in ----------------------------------------------------------------------------

    def schedule(self, job):
        self.jobs.append(job)
        self.wake.set()

    async def subscribe(self, frame):
        if isinstance(frame, SubscribeRun):
            await self.runs.subscribe(frame)
        elif isinstance(frame, SubscribeTree):
            await self.trees.subscribe(frame)
        elif isinstance(frame, SubscribeRoots):
            await self.roots.subscribe(frame)
        elif isinstance(frame, SubscribeApprovals):
            await self.approvals.subscribe(frame)
        else:
            await self.runners.subscribe(frame)

    async def unsubscribe(self, frame: Unsubscribe):
        for kind in (*self.streams, self.runners, self.approvals):
            await kind.unsubscribe(frame)

    def ring_run(self, message: dict):
        """A run-changed doorbell: mark what it touches; the worker reads it."""
        note_head(message.get("run"), message.get("sequence"))
        for kind in self.streams:
            kind.ring(message)
        self.wake.set()

    def ring_runners(self):
        if self.runners.ring():
            self.wake.set()

    def ring_approvals(self):
        if self.approvals.ring():
            self.wake.set()

    # --- channel groups, counted (several subscriptions may share one) ------------------------
    # Held through the process's hub (dashboard.live.hub): the process joins a group once,
    # whatever the number of its sockets that follow it.

    async def hold(self, group: str):
        count = self.groups_held.get(group, 0)
        self.groups_held[group] = count + 1
        if count == 0:
            await hub_for(self.socket.channel_layer).hold(group, self)

    async def release(self, group: str):
        count = self.groups_held.get(group, 0) - 1
        if count <= 0:
            self.groups_held.pop(group, None)
            await hub_for(self.socket.channel_layer).release(group, self)
        else:
            self.groups_held[group] = count

    # --- the worker: every read and send happens here, one at a time ---------------------------

    async def _work(self):
        while True:
            await self.wake.wait()
            self.wake.clear()
            try:
                await self._drain()
            except asyncio.CancelledError:
                raise
            except Closed:
                return
            except Backlogged:
                await self._resume_when_drained()
            except Exception:
                log.exception("live catch-up failed; retrying on the next doorbell or heartbeat")

    async def _drain(self):
        while self.jobs or any(kind.dirty for kind in self.streams):
            while self.jobs:
                job = self.jobs.pop(0)
                await job()
            for kind in self.streams:
                await kind.catch_up_dirty()
        await self.runners.catch_up_dirty()
        await self.approvals.catch_up_dirty()

    async def _beat(self):
        """Catch every subscription up from the database, then tell the client the heads.

        The first beat comes at a random point of the second half of the first period (never
        later than one period, as before: a change the doorbell could not carry still shows
        within it). Sockets opened together (a restart's reconnections, a team's dashboards)
        otherwise re-check and catch up all at once every period, each in turn on the
        process's one database thread, while the runners' frames wait behind them: at 4
        processes x 200 watchers that nearly doubled the push p99 of the seconds holding the
        beat (issue 39)."""
        delay = self.heartbeat_seconds * (0.5 + 0.5 * random.random())
        while True:
            await asyncio.sleep(delay)
            delay = self.heartbeat_seconds
            self.jobs.append(self._sweep_and_beat)
            self.wake.set()

    async def end_if_unauthorised(self):
        """Close the socket if its credential no longer holds: a logout, an expired session,
        a deactivated user, a removed role or a revoked or expired token ends the stream."""
        code = await database_sync_to_async(recheck)(self.user.pk, self.session_key, self.token)
        if code is not None:
            log.info("live socket of user %s closed with %s: authority ended", self.user.pk, code)
            credential_watch.forget(self)
            for task in self.tasks:
                if task is not asyncio.current_task():
                    task.cancel()
            self.jobs.clear()
            await self.socket.close(code=code)
            raise Closed

    async def _sweep_and_beat(self):
        # Authority is re-checked in full on every heartbeat (and at once when the credential
        # watch sees a token revoked or a user deactivated).
        await self.end_if_unauthorised()
        # The hub re-joins the process's groups after a Redis restart; this catches up what
        # was rung while they were forgotten.
        await self.catch_up_all()
        await self.send(
            {
                "type": "heartbeat",
                "at": int(time.time() * 1000),
                "runs": self.runs.positions(),
                "trees": self.trees.positions(),
            }
        )

    async def catch_up_all(self):
        for kind in (*self.streams, self.runners, self.approvals):
            await kind.catch_up_all()

    async def _resume_when_drained(self):
        """A paused socket resumes as soon as its client has taken half of the backlog."""
        await backpressure.after_half_drained(self.socket.base_send)
        self.jobs.insert(0, self._flush_owed)
        self.jobs.append(self.catch_up_all)
        self.wake.set()

    # --- frames out --------------------------------------------------------------------------

    async def send(self, frame: dict | str):
        backlog = backpressure.over_limit(self.socket.base_send)
        if backlog is not None:
            # Sending pauses instead of piling frames up in this process (the position of each
            # subscription stays where it was) and resumes from the database once the client
            # has drained its backlog.
            if not self.backlogged:
                log.info(
                    "live client %s paused: %d bytes unsent", self.socket.channel_name, backlog
                )
                self.backlogged = True
            raise Backlogged
        if self.backlogged:
            self.backlogged = False
            self._forget_what_was_sent()
        await self.socket.send(text_data=frame if isinstance(frame, str) else dumps(frame))

    async def send_patiently(self, frame):
        """Send a frame of a tree snapshot once the client has taken half of its backlog.

        A snapshot is bounded (it ends), so it waits for a slow client rather than pausing
        like the live stream: a paused snapshot would be abandoned half-sent, and the client
        would hold half a tree until it resubscribed.
        """
        await backpressure.until_half_drained(self.socket.base_send)
        await self.send(frame)

    def _forget_what_was_sent(self):
        """After a pause, resend state snapshots: some were dropped mid-way."""
        for kind in (*self.streams, self.runners, self.approvals):
            kind.forget_sent()

    async def error(self, field_name: str, message: str, code: str = "invalid"):
        await self.send({"type": "error", "code": code, "field": field_name, "message": message})

    async def reply(self, frame: dict):
        """Answer a client frame now, or once the client drains its backlog; never raise."""
        if not self.owed and not self.backlogged:
            try:
                await self.send(frame)
                return
            except Backlogged:
                pass
        # Bounded: a client that sends while not reading cannot grow this without end.
        if len(self.owed) < MAX_OWED_REPLIES:
            self.owed.append(frame)
        if self._flush_owed not in self.jobs:
            self.schedule(self._flush_owed)

    async def _flush_owed(self):
        """Send owed replies in order; a still-backlogged socket raises and keeps the rest."""
        while self.owed:
            await self.send(self.owed[0])
            self.owed.pop(0)

    async def reply_error(self, field_name: str, message: str, code: str = "invalid"):
        await self.reply({"type": "error", "code": code, "field": field_name, "message": message})

"""Run subscriptions: ``{"type": "subscribe", "runId": R, "after": N}``.

A run's events with ``sequence > N`` in order, with no gap and no duplicate, replayed from
the database and then pushed as they commit, plus the run's state whenever it changes.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from channels.db import database_sync_to_async

from dashboard.live.caps import MAX_RUN_SUBSCRIPTIONS
from dashboard.live.frames import SubscribeRun, Unsubscribe
from dashboard.live.read_cache import shared_run_delta
from delegation import metrics, notify, selectors
from delegation.layers import vouched_in_process, vouches_for_content
from delegation.wire import dumps

# Events per catch-up read: each may carry 4 x 32 KiB, so a page stays a few MB at most.
EVENT_PAGE = 100
# A run frame whose only news is the head (``lastSequence``) goes at most this often: the
# events frames already say how far the run has come, and a state frame per event doubled
# what 200 watchers of a busy run cost their processes (issue 39). Any other change of the
# state goes at once.
HEAD_ONLY_SECONDS = 1.0
MAX_FRAME_CHARS = 256 * 1024


@dataclass
class RunSub:
    pk: int
    run_id: str
    root_pk: int
    sent: int
    state: tuple | None = None
    state_sent_at: float = 0.0
    # Events that arrived with doorbells, in arrival order, not yet sent or discarded.
    carried: list = field(default_factory=list)


def _head_only(old: tuple | None, new: tuple) -> bool:
    """Whether the fingerprints differ in the head (``lastSequence``, second) alone."""
    return old is not None and old[:1] + old[2:] == new[:1] + new[2:]


def _run_fingerprint(state: dict) -> tuple:
    return (
        state["status"],
        state["lastSequence"],
        state["done"],
        state["cancelled"],
        state["error"],
        len(state["output"]),
        hash(state["output"]),
        state["cancelRequestedAt"],
        state["refusedSpawns"],
    )


def _batches(events: list[dict]):
    """Split events into frames of at most about MAX_FRAME_CHARS characters, in order."""
    batch, size = [], 0
    for event in events:
        cost = len(dumps(event))
        if batch and size + cost > MAX_FRAME_CHARS:
            yield batch
            batch, size = [], 0
        batch.append(event)
        size += cost
    if batch:
        yield batch


def _frames(run_id: str, events: list[dict]) -> list[tuple[dict, str]]:
    """Each frame's text, with the last event it carries."""
    return [
        (batch[-1], dumps({"type": "events", "runId": run_id, "events": batch}))
        for batch in _batches(events)
    ]


def _first_frames(events: list[dict], part: tuple[str, int]) -> list[tuple[dict, str]]:
    run_id, count = part
    return _frames(run_id, events[:count])


def _state_frame(state: dict, _part) -> str:
    return dumps({"type": "run", "run": state})


class SharedTexts:
    """Frames serialized once per process for every socket that sends them.

    The sockets of a process watching one run get the same read (``read_cache``): the same
    list of events and the same state object. Serializing them once, not once per watcher,
    took the JSON encoding off the top of a profile with 50 watchers a process (issue 39).
    Keyed by the object read and what is taken of it; the entry holds the object, so its id
    cannot be reused while the entry lives. Bounded by characters, not entries: a read of
    large events is megabytes, and the sockets that share it send it within moments, so
    the newest few reads are all it needs to hold."""

    MAX_CHARS = 2_000_000

    def __init__(self):
        self._texts: OrderedDict = OrderedDict()
        self._chars = 0

    def get(self, source: object, part, make):
        """``make(source, part)``, made once while the entry lives."""
        key = (id(source), part)
        found = self._texts.get(key)
        if found is not None and found[0] is source:
            return found[1]
        made = make(source, part)
        # What the entry keeps alive: the texts, and the object read about as much again.
        chars = 2 * (len(made) if isinstance(made, str) else sum(len(t) for _e, t in made))
        if chars <= self.MAX_CHARS:
            if key in self._texts:
                self._chars -= self._texts.pop(key)[2]
            self._texts[key] = (source, made, chars)
            self._chars += chars
            while self._chars > self.MAX_CHARS:
                self._chars -= self._texts.popitem(last=False)[1][2]
        return made


shared_texts = SharedTexts()


class RunSubscriptions:
    """The runs one socket follows, keyed by run pk, and which of them a doorbell rang."""

    def __init__(self, connection):
        self.connection = connection
        self.subs: dict[int, RunSub] = {}
        self.dirty: set[int] = set()
        # Carried events are sent on only from a layer that vouches for them (SPEC §13).
        self.vouched = vouches_for_content(connection.socket.channel_layer)

    async def subscribe(self, frame: SubscribeRun):
        conn = self.connection
        run = await database_sync_to_async(selectors.get_run)(frame.run_id)
        if run is None:
            await conn.error("runId", f"runId: no run {frame.run_id!r}", "not_found")
            return
        if run.pk not in self.subs and len(self.subs) >= MAX_RUN_SUBSCRIPTIONS:
            await conn.error("runId", f"runId: at most {MAX_RUN_SUBSCRIPTIONS} runs", "limit")
            return
        old = self.subs.get(run.pk)
        self.subs[run.pk] = RunSub(run.pk, run.run_id, run.root_id or run.pk, frame.after)
        if old is None:
            await conn.hold(notify.run_group(run.pk))
        await conn.send({"type": "subscribed", "runId": run.run_id, "after": frame.after})
        await self._catch_up(self.subs[run.pk])

    async def unsubscribe(self, frame: Unsubscribe):
        if frame.run_id is None:
            return
        for pk, sub in list(self.subs.items()):
            if sub.run_id == frame.run_id:
                del self.subs[pk]
                await self.connection.release(notify.run_group(pk))

    def ring(self, message: dict) -> None:
        """A run-changed doorbell: keep the events it carries, to send without a read."""
        run_pk = message.get("run")
        sub = self.subs.get(run_pk)
        if sub is None:
            return
        if (
            message.get("events")
            and sub.state
            and message.get("status") == sub.state[0]
            and (self.vouched or vouched_in_process(message))
        ):
            sub.carried.append(message["events"])
        else:
            sub.carried.append(None)  # something a doorbell cannot carry: read it
        self.dirty.add(run_pk)

    async def catch_up_dirty(self):
        dirty, self.dirty = self.dirty, set()
        for pk in sorted(dirty):
            if pk in self.subs and not await self._push_carried(self.subs[pk]):
                await self._catch_up(self.subs[pk])

    async def catch_up_all(self):
        for sub in list(self.subs.values()):
            await self._catch_up(sub)

    def positions(self) -> dict[str, int]:
        """The heartbeat's ``runs``: the last sequence sent of every run."""
        return {sub.run_id: sub.sent for sub in self.subs.values()}

    def forget_sent(self):
        for sub in self.subs.values():
            sub.state = None
            sub.carried = []

    async def _send_events(self, sub: RunSub, frames: list[tuple[dict, str]]):
        for last, text in frames:
            await self.connection.send(text)
            sub.sent = last["sequence"]
            metrics.pushed(last.get("createdAt"))

    async def _push_carried(self, sub: RunSub) -> bool:
        """Send events that came with doorbells if they continue exactly where this socket
        is; False when anything is missing or unknown, and the database must be read."""
        carried, sub.carried = sub.carried, []
        if not carried:
            return False
        # Coalesced: a socket that fell behind by several doorbells gets one frame with all
        # of them (split only at MAX_FRAME_CHARS), not a frame per doorbell.
        pending: list[dict] = []
        ok = True
        for events in carried:
            if events is None:
                ok = False
                break
            head = pending[-1]["sequence"] if pending else sub.sent
            fresh = [event for event in events if event["sequence"] > head]
            if not fresh:
                continue  # already sent by an earlier read
            if fresh[0]["sequence"] != head + 1:
                ok = False  # a gap: a doorbell was lost or came out of order
                break
            pending.extend(fresh)
        if len(carried) == 1 and pending and pending[0] is carried[0][0]:
            # One doorbell, all of it new (a caught-up watcher): the same list reached every
            # socket of the process that holds the run, so its frames are encoded once.
            frames = shared_texts.get(carried[0], (sub.run_id, len(pending)), _first_frames)
            await self._send_events(sub, frames)
        elif pending:
            await self._send_events(sub, _frames(sub.run_id, pending))
        return ok

    async def _catch_up(self, sub: RunSub):
        while True:
            state, events = await shared_run_delta(sub.pk, sub.sent, EVENT_PAGE)
            if state is None:
                return
            fresh = 0
            for event in events:
                # Sequences are allocated under the run's lock, so what is visible is a prefix;
                # stopping at a hole anyway means a frame can never skip a sequence.
                if event["sequence"] != sub.sent + fresh + 1:
                    break
                fresh += 1
            frames = shared_texts.get(events, (sub.run_id, fresh), _first_frames)
            await self._send_events(sub, frames)
            fingerprint = _run_fingerprint(state)
            now = time.monotonic()
            if fingerprint != sub.state and (
                not _head_only(sub.state, fingerprint)
                or now - sub.state_sent_at >= HEAD_ONLY_SECONDS
            ):
                sub.state, sub.state_sent_at = fingerprint, now
                text = shared_texts.get(state, "run", _state_frame)
                await self.connection.send(text)
            if len(events) < EVENT_PAGE or fresh < len(events):
                return

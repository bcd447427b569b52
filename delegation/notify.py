"""Doorbells. The database is the record; these only tell listeners to go and read it.

Every ring is sent after the transaction that wrote the record commits, so a listener that
reacts to it always finds the rows. A ring may be lost (channels-redis drops messages when a
channel is over capacity): listeners therefore also catch up on their own from the database.
Group names use primary keys because runIds may hold characters channel names cannot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import weakref
from contextlib import contextmanager

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

RUNNERS_GROUP = "runners"
TREES_GROUP = "trees"
# Every pending approval across trees (the inbox): one group, viewer-visible, content-free.
APPROVALS_GROUP = "approvals"


def run_group(run_pk: int) -> str:
    return f"run.{run_pk}"


def tree_group(root_pk: int) -> str:
    return f"tree.{root_pk}"


def runner_group(runner_pk: int) -> str:
    return f"runner.{runner_pk}"


_local = threading.local()


@contextmanager
def collect():
    """Hold this thread's doorbells so an async caller can ring them without a thread hop.

    The runner socket's hot path (run.event) would otherwise block its database thread on a
    round trip to the event loop for every ring.
    """
    bells: dict[tuple, dict] = {}
    previous = getattr(_local, "bells", None), getattr(_local, "carried_chars", None)
    _local.bells, _local.carried_chars = bells, {}
    try:
        yield bells
    finally:
        _local.bells, _local.carried_chars = previous


# The listener of this process on each event loop (the live hub: one channel for all its
# sockets), which a group commit rings directly: on Redis a doorbell for the committing
# process's own watchers otherwise went out and came back (two round trips and a receive),
# and, since Redis does not vouch for what a message carries, every one of them then read
# the database for events the doorbell had with it. Other processes are rung through the layer.
_listeners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def listen_in_process(listener) -> None:
    """Ring ``listener`` (``.layer``, ``.channel``, ``.ring_here(messages)``) directly with the
    doorbells committed on this event loop; the layer skips its channel."""
    _listeners[asyncio.get_running_loop()] = listener


async def ring_collected(bells: dict[tuple, dict]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    messages = [(group, message) for (group, _run), message in bells.items()]
    if hasattr(layer, "group_send_many"):
        listener = _listeners.get(asyncio.get_running_loop())
        skip = None
        if listener is not None and listener.layer is layer and listener.channel:
            skip = listener.channel
            listener.ring_here(messages)
        # A group commit's doorbells (three a run: the run, its tree, the overview) in two
        # Redis round trips, not two to four each.
        await layer.group_send_many(messages, skip_channel=skip)
        return
    for (group, _run), message in bells.items():
        try:
            await layer.group_send(group, message)
        except Exception:
            log.warning("doorbell to %s failed", group, exc_info=True)


def _send(group: str, message: dict) -> None:
    # The group rides along: a process's live hub hands the ring to the sockets holding it.
    message = {**message, "group": group}
    bells = getattr(_local, "bells", None)
    if bells is not None:
        # One ring per group and run: listeners read the database anyway, but a tree's
        # listeners want to know every run that changed.
        key = (group, message.get("run"))
        earlier = bells.get(key)
        if earlier is not None and "events" in earlier and "events" in message:
            # Frames committed together (a group commit): one ring carries all their events
            # while they fit, so a caught-up watcher still pushes them without a read.
            message = _carrying_both(earlier, message, _local.carried_chars, key)
        bells[key] = message
        return
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # a lost doorbell only delays listeners until their next catch-up
        log.warning("doorbell to %s failed", group, exc_info=True)


# Events ride along with a ring when they are this small (``payload_chars``); larger frames
# are read back.
MAX_PAYLOAD_CHARS = 16 * 1024
# The JSON of an event in the live shape with an empty kind and actor (a 7-digit sequence, a
# millisecond createdAt, truncated): what every event costs besides its values.
_EVENT_CHARS = 96
_ALWAYS_TEXT = ("kind", "actor")
_OPTIONAL_TEXT = ("text", "error", "toolName", "toolCallId")
_OPTIONAL_JSON = ("input", "toolOutput", "data", "success")


def payload_chars(events: list[dict]) -> int:
    """About the JSON size of ``events`` in the live shape, for MAX_PAYLOAD_CHARS. Encoding
    every frame's events only to measure them was a tenth of ingest on SQLite (issue 39), so
    text fields count their characters (an escaped or non-ASCII character once, where JSON
    may write up to six) and only structured values (a tool's input and output, data) are
    encoded."""
    chars = 0
    for event in events:
        chars += _EVENT_CHARS
        for name in _ALWAYS_TEXT:
            chars += len(event.get(name) or "")
        for name in _OPTIONAL_TEXT:
            if name in event:  # ', "name": "value"'
                chars += len(name) + 8 + len(event[name] or "")
        for name in _OPTIONAL_JSON:
            if name in event:  # ', "name": value'
                chars += len(name) + 6 + len(json.dumps(event[name]))
    return chars


def _carrying_both(earlier: dict, later: dict, sizes: dict, key: tuple) -> dict:
    """The later ring (the run as it now is) with the earlier ring's events before its own;
    without events when they would not continue each other or no longer fit, and a
    listener then reads them back. ``sizes`` keeps each ring's carried size, so a group of
    frames measures each frame's events once."""
    chars = sizes.get(key) or payload_chars(earlier["events"])
    chars += payload_chars(later["events"])
    continues = earlier["events"][-1]["sequence"] + 1 == later["events"][0]["sequence"]
    if continues and chars <= MAX_PAYLOAD_CHARS:
        sizes[key] = chars
        return {**later, "events": earlier["events"] + later["events"]}
    sizes.pop(key, None)
    return {name: value for name, value in later.items() if name != "events"}


def run_changed(run, *, new_run: bool = False, events: list[dict] | None = None) -> None:
    """Ring the run's, its tree's and the overview's listeners once this transaction commits.

    ``events`` (the live shape of what this transaction appended) lets a listener that is
    exactly caught up push them without a read; any other listener reads the database.
    """
    root_pk = run.root_id or run.pk
    message = {
        "type": "run.changed",
        "run": run.pk,
        "root": root_pk,
        "sequence": run.last_sequence,
        "status": run.status,
        "new": new_run,
    }
    run_message = message
    if events and payload_chars(events) <= MAX_PAYLOAD_CHARS:
        run_message = {**message, "events": events}

    def ring():
        _send(run_group(run.pk), run_message)
        _send(tree_group(root_pk), message)
        if new_run or run.parent_id is None:
            _send(TREES_GROUP, message)

    transaction.on_commit(ring)


def runner_outbox(runner_pk: int) -> None:
    """Tell the connection holding this runner that commands are waiting."""
    transaction.on_commit(lambda: _send(runner_group(runner_pk), {"type": "outbox.ring"}))


def credentials_group(runner_pk: int) -> str:
    """Every MCP call waiting under a run token of this runner (SPEC §11: authority ends at
    revocation): rung when the runner's token is rotated or revoked."""
    return f"credentials.{runner_pk}"


def runner_fenced(runner_pk: int, why: str) -> None:
    """Close every socket of this runner, and wake every call waiting under its run tokens:
    its credential no longer holds (each re-reads the record before it believes that)."""

    def ring():
        _send(runner_group(runner_pk), {"type": "runner.revoked", "why": why})
        _send(credentials_group(runner_pk), {"type": "credentials.changed"})

    transaction.on_commit(ring)


def runner_changed(runner_pk: int) -> None:
    transaction.on_commit(
        lambda: _send(RUNNERS_GROUP, {"type": "runner.changed", "runner": runner_pk})
    )


def approvals_changed() -> None:
    """Tell the inboxes that an approval was requested, decided or expired.

    The ring carries no approval content: a watcher reads the list back through
    ``/api/approvals``, whose rules decide what it may see.
    """
    transaction.on_commit(lambda: _send(APPROVALS_GROUP, {"type": "approvals.changed"}))

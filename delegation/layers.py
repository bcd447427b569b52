"""A Redis channel layer that outlives Redis outages.

The channel layer only rings doorbells; the database is the record. So when Redis is down
or restarting, a doorbell may be lost (listeners catch up from the database on their own),
but a socket must not die: channels-redis raises out of ``receive`` and every consumer in
the process closes with 1011, and a failed ``group_add`` fails the call that made it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import weakref

from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer

from delegation.lograte import RateLimitedLog

log = logging.getLogger(__name__)
# An outage loses every doorbell rung during it: one line, then one count per 10 s per kind.
faults = RateLimitedLog(log, window=10.0)

RETRY_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.0)

# channels-redis's group_send script, for many messages at once, each with its own score so
# that a channel's messages are popped in the order they were given.
_SEND_MANY = """
local count = #KEYS
local expiry = ARGV[3 * count + 1]
local over_capacity = 0
for i = 1, count do
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[count + i]) then
        redis.call('ZADD', KEYS[i], ARGV[2 * count + i], ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""


# What a consumer's own socket hands it, told apart from what the channel layer does: channels
# dispatches both through one handler table, so without this a ``websocket.receive`` written to
# a consumer's channel would be taken as a frame of its socket (SPEC §13). An object, not a
# value, so nothing serialised can carry it.
_FROM_SOCKET = object()
_ORIGIN = "canopy.origin"


def from_socket(receive):
    """``receive`` of an ASGI connection, its messages marked as the socket's own."""

    async def marked():
        message = await receive()
        message[_ORIGIN] = _FROM_SOCKET
        return message

    return marked


def forged_socket_message(message: dict) -> bool:
    """A ``websocket.*`` message that did not come from the consumer's socket."""
    return str(message.get("type", "")).startswith("websocket.") and (
        message.get(_ORIGIN) is not _FROM_SOCKET
    )


# What a doorbell rung within this process carries (``notify.listen_in_process``): the
# events this process committed, so they may be pushed as they are. Like _FROM_SOCKET, an
# object that no serialised message can carry.
_RUNG_HERE = object()
_IN_PROCESS = "canopy.in_process"


def rung_in_process(message: dict) -> dict:
    return {**message, _IN_PROCESS: _RUNG_HERE}


def vouched_in_process(message: dict) -> bool:
    return message.get(_IN_PROCESS) is _RUNG_HERE


def vouches_for_content(layer) -> bool:
    """Whether what a message of ``layer`` carries (a doorbell's events) may be passed on as
    it is: an in-process layer's messages come from this process, an encrypted layer's from a
    process holding ``CHANNEL_LAYER_KEY``. Anything else only rings: the reader re-reads the
    database (issue 33: a doorbell pushed into password-less Redis showed a browser an event
    that was never stored)."""
    if isinstance(layer, InMemoryChannelLayer):
        return True
    serializer = getattr(layer, "_serializer", None)
    return getattr(serializer, "crypter", None) is not None


def recently_faulted(layer, *, within: float) -> bool:
    """Whether ``layer`` lost a message or a membership in the last ``within`` seconds.

    Pollers use it to go fast while doorbells may be lost, and for a while after, since a
    restarted Redis has forgotten every group membership until its consumers join again.
    A layer that never fails (the in-memory one) is never faulted."""
    faulted_at = getattr(layer, "faulted_at", None)
    return faulted_at is not None and time.monotonic() - faulted_at < within


async def until_faulted(layer, *, timeout: float) -> None:
    """Sleep ``timeout`` seconds, or less if ``layer`` fails meanwhile (then at once)."""
    signal = getattr(layer, "fault_signal", None)
    if signal is None:
        await asyncio.sleep(timeout)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(signal().wait(), timeout)


class UnreadableMessage(Exception):
    """A message in Redis that this layer did not write (see ``deserialize``)."""


class ResilientRedisChannelLayer(RedisChannelLayer):
    faulted_at: float | None = None

    def fault_signal(self) -> asyncio.Event:
        """An event set at the next fault. One per fault (set once, then replaced, so no
        waiter clears another's) and per event loop: an asyncio.Event belongs to the loop it
        is awaited on, and one layer outlives many loops (the suite runs one per test)."""
        loop = asyncio.get_running_loop()
        events = self.__dict__.setdefault("_fault_events", weakref.WeakKeyDictionary())
        event = events.get(loop)
        if event is None:
            event = events[loop] = asyncio.Event()
        return event

    def _faulted(self) -> None:
        self.faulted_at = time.monotonic()
        events = self.__dict__.pop("_fault_events", None) or {}
        for loop, event in list(events.items()):
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    def deserialize(self, message):
        """A message this layer cannot read — not encrypted with ``CHANNEL_LAYER_KEY``, or not
        msgpack at all — was written by someone else into Redis (SPEC §13): dropped, counted,
        never handed to a consumer."""
        try:
            return super().deserialize(message)
        except Exception as exc:
            faults.warning(
                "unreadable",
                "dropped a channel-layer message it cannot read (%s)",
                type(exc).__name__,
            )
            raise UnreadableMessage from None

    async def receive_single(self, channel):
        while True:
            try:
                return await super().receive_single(channel)
            except UnreadableMessage:  # popped and gone: wait for the next one
                continue

    async def receive(self, channel):
        attempt = 0
        while True:
            try:
                return await super().receive(channel)
            except Exception as exc:  # Redis down or restarting: wait, then listen again
                self._faulted()
                delay = RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)]
                if attempt == 0:
                    faults.warning(
                        "receive failed", "channel layer receive failed (%s); retrying", exc
                    )
                attempt += 1
                await asyncio.sleep(delay)

    async def send(self, channel, message):
        try:
            await super().send(channel, message)
        except Exception as exc:
            self._faulted()
            faults.warning("send lost", "channel layer send to %s lost (%s)", channel, exc)

    async def group_send(self, group, message):
        try:
            await super().group_send(group, message)
        except Exception as exc:
            self._faulted()
            faults.warning("doorbell lost", "doorbell to %s lost (%s)", group, exc)

    async def group_send_many(
        self, messages: list[tuple[str, dict]], *, skip_channel: str | None = None
    ) -> None:
        """``group_send`` of every (group, message), in two Redis round trips per Redis
        server rather than two to four per group: one pipeline reads every group's
        channels, one script adds every message to its channels (capacity kept as
        channels-redis keeps it). A group commit rings a doorbell per run it appended to.
        ``skip_channel``: a member already rung in its own process (``notify``)."""
        try:
            await self._group_send_many(messages, skip_channel)
        except Exception as exc:
            self._faulted()
            faults.warning("doorbell lost", "%d doorbells lost (%s)", len(messages), exc)

    async def _group_send_many(self, messages: list[tuple[str, dict]], skip_channel) -> None:
        by_server = collections.defaultdict(list)
        for group, message in messages:
            assert self.require_valid_group_name(group), "Group name not valid"
            by_server[self.consistent_hash(group)].append((group, message))
        sends = collections.defaultdict(list)  # server -> [(channel key, message, capacity)]
        for index, items in by_server.items():
            pipe = self.connection(index).pipeline(transaction=False)
            for group, _message in items:
                key = self._group_key(group)
                pipe.zremrangebyscore(key, min=0, max=int(time.time()) - self.group_expiry)
                pipe.zrange(key, 0, -1)
            replies = await pipe.execute()
            for (_group, message), members in zip(items, replies[1::2], strict=True):
                names = [member.decode("utf8") for member in members]
                names = [name for name in names if name != skip_channel]
                if not names:
                    continue
                keys_by_server, payloads, capacities = self._map_channel_keys_to_connection(
                    names, message
                )
                for server, keys in keys_by_server.items():
                    sends[server] += [(key, payloads[key], capacities[key]) for key in keys]
        for server, entries in sends.items():
            connection = self.connection(server)
            stale = int(time.time()) - int(self.expiry)
            pipe = connection.pipeline(transaction=False)
            for key in dict.fromkeys(key for key, _payload, _capacity in entries):
                pipe.zremrangebyscore(key, min=0, max=stale)
            await pipe.execute()
            now = time.time()
            keys = [key for key, _payload, _capacity in entries]
            args = [payload for _key, payload, _capacity in entries]
            args += [capacity for _key, _payload, capacity in entries]
            args += [now + i * 1e-6 for i in range(len(entries))]
            over = await connection.eval(_SEND_MANY, len(keys), *keys, *args, self.expiry)
            if over:
                log.info("%d of %d doorbells over capacity", over, len(entries))

    async def group_add(self, group, channel):
        try:
            await super().group_add(group, channel)
        except Exception as exc:  # consumers re-join their groups periodically
            self._faulted()
            faults.warning("group join failed", "joining %s failed (%s); will retry", group, exc)

    async def group_discard(self, group, channel):
        try:
            await super().group_discard(group, channel)
        except Exception as exc:  # membership expires on its own
            self._faulted()
            faults.warning("group leave failed", "leaving %s failed (%s)", group, exc)

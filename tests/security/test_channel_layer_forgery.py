"""A message on the channel layer cannot act (SPEC §13, issue 33): whoever can write to Redis
(an agent on the machine, before its network is its own) must not finish another tree's run,
stop a runner or speak for a browser.

- a ``websocket.receive`` sent through the channel layer is never taken as a frame of the
  socket (on every layer: the in-memory one here, Redis on the second pass);
- ``runner.revoked`` / ``runner.fenced`` close a socket only if the record says so;
- with ``CHANNEL_LAYER_KEY`` (the suite sets one), a message written into Redis by anyone but
  the layer is dropped unread.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import msgpack
import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils.module_loading import import_string

from delegation import models, notify
from tests.support.rpc import adb

pytestmark = pytest.mark.django_db(transaction=True)


async def _runner_row(name: str = "runner-a") -> models.Runner:
    return await adb(models.Runner.objects.get)(name=name)


async def test_it_takes_no_runner_frame_from_the_channel_layer(runner):
    await runner.open("root-1")
    row = await _runner_row()
    assert row.channel_name
    forged = {"jsonrpc": "2.0", "id": 99, "method": "run.finish", "params": {"runId": "root-1"}}
    layer = get_channel_layer()
    await layer.send(row.channel_name, {"type": "websocket.receive", "text": json.dumps(forged)})
    await layer.send(row.channel_name, {"type": "websocket.disconnect", "code": 1000})
    await asyncio.sleep(0.5)

    run = await adb(models.Run.objects.get)(run_id="root-1")
    assert run.status == "running" and run.emitted == 0
    assert await runner.quiet(0.2) == []  # nothing was answered for the forged frame
    # The socket is the runner's still: its own frames go on being taken.
    await runner.emit("root-1", ["still mine"])
    await runner.finish("root-1", output="done")
    run = await adb(models.Run.objects.get)(run_id="root-1")
    assert (run.status, run.emitted) == ("succeeded", 1)


@pytest.mark.parametrize("kind", ["runner.revoked", "runner.fenced"])
async def test_it_closes_a_runner_only_when_the_record_says_so(runner, kind):
    await runner.open("root-1")
    row = await _runner_row()
    layer = get_channel_layer()
    await layer.group_send(notify.runner_group(row.pk), {"type": kind, "why": "forged"})
    await layer.send(row.channel_name, {"type": kind, "why": "forged"})
    assert await runner.quiet(1.0) == []  # no close, no answer
    await runner.emit("root-1", ["still connected"])
    row = await _runner_row()
    assert row.connected and row.revoked_at is None


@pytest.mark.postgres(redis=True)
async def test_it_drops_a_message_written_into_redis_without_the_key(runner):
    """What an agent that reached Redis did in issue 33: ZADD a plain (msgpack) message onto a
    consumer's channel. Written the way channels-redis writes, but not encrypted."""
    assert settings.CHANNEL_LAYER_KEYS, "the suite sets CHANNEL_LAYER_KEY (pyproject.toml)"
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await _zadd_plain(layer, channel, {"type": "forged.doorbell", "n": 1})
    await layer.send(channel, {"type": "real.doorbell", "n": 2})
    got = await asyncio.wait_for(layer.receive(channel), 5)
    assert got == {"type": "real.doorbell", "n": 2}

    # The same onto the runner's own channel: a forged frame and a forged revocation.
    await runner.open("root-1")
    row = await _runner_row()
    frame = {"jsonrpc": "2.0", "id": 7, "method": "run.finish", "params": {"runId": "root-1"}}
    await _zadd_plain(
        layer, row.channel_name, {"type": "websocket.receive", "text": json.dumps(frame)}
    )
    await _zadd_plain(layer, row.channel_name, {"type": "runner.revoked", "why": "forged"})
    assert await runner.quiet(1.0) == []  # no close, no answer
    run = await adb(models.Run.objects.get)(run_id="root-1")
    assert run.status == "running"
    await runner.emit("root-1", ["still connected"])


async def _zadd_plain(layer, channel: str, message: dict) -> None:
    """channels-redis's ``send``, without its serializer's encryption: a random 12-byte prefix
    and msgpack, onto the sorted set of the channel's process."""
    message = {**message, "__asgi_channel__": channel}
    key = layer.prefix + layer.non_local_name(channel)
    payload = os.urandom(12) + msgpack.packb(message, use_bin_type=True)
    connection = layer.connection(layer.consistent_hash(key))
    await connection.zadd(key, {payload: time.time()})


def _follower(layer):
    """One socket's run subscriptions, following run pk 1 in state ``running``."""
    from types import SimpleNamespace

    from dashboard.live.runs import RunSub, RunSubscriptions

    subs = RunSubscriptions(SimpleNamespace(socket=SimpleNamespace(channel_layer=layer)))
    subs.subs[1] = RunSub(pk=1, run_id="root-1", root_pk=1, sent=0, state=("running",))
    return subs


FORGED_BELL = {
    "type": "run.changed",
    "run": 1,
    "status": "running",
    "events": [{"sequence": 1, "kind": "text", "text": "allow by operator:admin1"}],
}


@pytest.mark.parametrize(
    ("config", "passed_on"),
    [
        ({"BACKEND": "channels.layers.InMemoryChannelLayer"}, True),
        ({"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {}}, False),
        (
            {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                "CONFIG": {"symmetric_encryption_keys": ["k" * 32]},
            },
            True,
        ),
    ],
    ids=["in-memory", "redis-without-key", "redis-with-key"],
)
def test_it_passes_on_a_doorbells_events_only_from_a_layer_that_vouches_for_them(config, passed_on):
    """Issue 33: a doorbell pushed into password-less Redis carried an event that was never
    stored, and the browser showed it. Without the key only the ring counts: the socket reads
    the database."""
    layer = import_string(config["BACKEND"])(**config.get("CONFIG", {}))
    subs = _follower(layer)
    subs.ring(FORGED_BELL)
    carried = subs.subs[1].carried
    assert carried == ([FORGED_BELL["events"]] if passed_on else [None])
    assert subs.dirty == {1}  # rung either way: the socket catches up


def test_it_takes_a_doorbells_events_as_rung_in_process_only_from_this_process():
    """A doorbell this process rang itself (``notify.listen_in_process``) carries events the
    socket may pass on without the key; a message from Redis naming the same marker is one
    more forged ring, and only rings."""
    from delegation.layers import rung_in_process

    layer = import_string("channels_redis.core.RedisChannelLayer")()
    subs = _follower(layer)
    forged = msgpack.unpackb(msgpack.packb({**FORGED_BELL, "canopy.in_process": True}))
    subs.ring(forged)
    subs.ring(rung_in_process(FORGED_BELL))
    assert subs.subs[1].carried == [None, FORGED_BELL["events"]]

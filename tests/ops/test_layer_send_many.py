"""``group_send_many`` (issue 26): a group commit's doorbells reach Redis in two round trips,
and each channel still gets what ``group_send`` would have given it, in order, within its
capacity; with Redis down the doorbells are lost and counted, never raised."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from django.conf import settings

from delegation.layers import ResilientRedisChannelLayer

pytestmark = pytest.mark.postgres(redis=True)


def _layer(url: str, **options) -> ResilientRedisChannelLayer:
    return ResilientRedisChannelLayer(hosts=[url], prefix=f"t{uuid.uuid4().hex[:8]}", **options)


async def _drain(layer, channel) -> list[int]:
    got = []
    while True:
        try:
            message = await asyncio.wait_for(layer.receive(channel), 0.3)
        except TimeoutError:
            return got
        got.append(message["n"])


async def test_it_gives_every_channel_of_every_group_its_messages_in_order():
    layer = _layer(settings.REDIS_URL)
    one, two = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("run.1", one)
    await layer.group_add("tree.1", one)
    await layer.group_add("tree.1", two)
    messages = [
        ("run.1", {"type": "m", "n": 1}),
        ("tree.1", {"type": "m", "n": 2}),
        ("trees", {"type": "m", "n": 3}),  # nobody listens: nothing sent, nothing raised
        ("run.2", {"type": "m", "n": 4}),
    ]
    messages += [(f"run.{n}", {"type": "m", "n": n}) for n in range(5, 9)]
    await layer.group_add("run.7", one)
    await layer.group_send_many(messages)
    assert await _drain(layer, one) == [1, 2, 7]
    assert await _drain(layer, two) == [2]
    assert layer.faulted_at is None
    await layer.flush()


async def test_it_keeps_each_channels_capacity():
    layer = _layer(settings.REDIS_URL, capacity=3)
    channel = await layer.new_channel()
    for n in range(5):
        await layer.group_add(f"run.{n}", channel)
    await layer.group_send_many([(f"run.{n}", {"type": "m", "n": n}) for n in range(5)])
    assert await _drain(layer, channel) == [0, 1, 2]  # the rest dropped, as group_send does
    await layer.flush()


async def test_it_loses_doorbells_without_raising_while_redis_is_down():
    layer = _layer("redis://127.0.0.1:1/0")
    await layer.group_send_many([("run.1", {"type": "m", "n": 1}), ("tree.1", {"type": "m"})])
    assert layer.faulted_at is not None

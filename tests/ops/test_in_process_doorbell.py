"""A group commit rings its own process's live hub directly (issue 39): on Redis the doorbell
for the committing process's watchers went out and came back, and, since Redis does not
vouch for what a message carries, each of them then read the database for events the
doorbell had with it. The hub is rung once, marked as this process's own; every other member
of the group is still rung through Redis."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from django.conf import settings

from dashboard.live.hub import Hub
from delegation import notify
from delegation.layers import ResilientRedisChannelLayer, vouched_in_process

pytestmark = pytest.mark.postgres(redis=True)


class Watcher:
    """What the hub hands rings to: a live socket's connection, recording them."""

    def __init__(self):
        self.rung: list[dict] = []

    def ring_run(self, message: dict):
        self.rung.append(message)


async def test_it_rings_its_own_hub_once_and_every_other_process_through_redis(monkeypatch):
    layer = ResilientRedisChannelLayer(hosts=[settings.REDIS_URL], prefix=uuid.uuid4().hex[:8])
    monkeypatch.setattr(notify, "get_channel_layer", lambda: layer)
    hub, here = Hub(layer), Watcher()
    await hub.hold("run.7", here)  # this process's hub: it listens on Redis too
    elsewhere = await layer.new_channel()  # another process's hub
    await layer.group_add("run.7", elsewhere)
    bell = {"type": "run.changed", "run": 7, "status": "running", "group": "run.7"}
    bell["events"] = [{"sequence": 1, "kind": "text", "text": "a"}]
    try:
        await notify.ring_collected({("run.7", 7): bell})
        assert len(here.rung) == 1  # at once, before any Redis round trip came back
        assert vouched_in_process(here.rung[0]) and here.rung[0]["events"] == bell["events"]

        other = await asyncio.wait_for(layer.receive(elsewhere), 5)
        assert other["events"] == bell["events"] and not vouched_in_process(other)
        await asyncio.sleep(0.5)  # what Redis would have brought the hub as well
        assert len(here.rung) == 1, here.rung
        assert hub.received == 1
    finally:
        await hub.release("run.7", here)
        await layer.flush()


async def test_it_leaves_a_process_without_watchers_of_the_group_to_redis_alone(monkeypatch):
    layer = ResilientRedisChannelLayer(hosts=[settings.REDIS_URL], prefix=uuid.uuid4().hex[:8])
    monkeypatch.setattr(notify, "get_channel_layer", lambda: layer)
    hub, here = Hub(layer), Watcher()
    await hub.hold("run.8", here)  # the hub listens, but not to run.9
    elsewhere = await layer.new_channel()
    await layer.group_add("run.9", elsewhere)
    try:
        await notify.ring_collected({("run.9", 9): {"type": "run.changed", "run": 9}})
        assert (await asyncio.wait_for(layer.receive(elsewhere), 5))["run"] == 9
        assert here.rung == [] and hub.received == 0
    finally:
        await hub.release("run.8", here)
        await layer.flush()

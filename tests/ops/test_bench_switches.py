"""The switches the benchmark compares against (issue 34 item 5) each run under a test, so the
production code they keep is not code no test runs:

- ``ROLLUPS_ENABLED=false`` (ingest with and without rollups): usage is stored, no rollup;
- ``LIVE_FANOUT=socket`` (live fan-out per socket instead of per process): a live socket still
  gets every event once, in order.

- ``REDIS_CHANNEL_LAYER=pubsub`` (channels-redis's pub/sub layer): the same, on Redis.
"""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings

from delegation.models import Event, RunRollup
from tests.support.live import operator_socket, until
from tests.support.rpc import adb

pytestmark = pytest.mark.django_db(transaction=True)

USAGE = {"kind": "usage", "input": {"inputTokens": 10, "outputTokens": 5}}


async def test_it_stores_usage_without_rollups_when_they_are_switched_off(runner, settings):
    settings.ROLLUPS_ENABLED = False
    await runner.open("root-1")
    await runner.ok("run.event", {"runId": "root-1", "from": 1, "events": [USAGE]})
    assert await adb(Event.objects.filter(run__run_id="root-1", kind="usage").count)() == 1
    tokens = RunRollup.objects.filter(run__run_id="root-1").values_list("own_tokens_in", flat=True)
    assert set(await adb(list)(tokens)) <= {0}  # no row, or the run's empty one
    settings.ROLLUPS_ENABLED = True  # and on, the same frame makes the run's rollup
    await runner.ok("run.event", {"runId": "root-1", "from": 2, "events": [USAGE]})
    rollup = await adb(RunRollup.objects.get)(run__run_id="root-1")
    assert rollup.own_tokens_in == 10


async def test_it_pushes_every_event_once_with_fan_out_per_socket(runner, operator, settings):
    settings.LIVE_FANOUT = "socket"
    await _every_event_once(runner, operator)


@pytest.mark.postgres(redis=True)
async def test_it_pushes_every_event_once_on_the_pub_sub_layer(runner, operator, settings):
    layer = django_settings.CHANNEL_LAYERS["default"]
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": layer["CONFIG"]["hosts"],
                "symmetric_encryption_keys": django_settings.CHANNEL_LAYER_KEYS,
            },
        }
    }
    await _every_event_once(runner, operator)


async def _every_event_once(runner, operator):
    await runner.open("root-1")
    ws = await operator_socket(operator)
    await ws.send_json_to({"type": "subscribe", "runId": "root-1", "after": 0})
    await until(ws, lambda f: f["type"] == "run")
    for start, texts in ((1, ["a", "b"]), (3, ["c"])):
        events = [{"kind": "text", "text": t} for t in texts]
        await runner.ok("run.event", {"runId": "root-1", "from": start, "events": events})
    frames = await until(ws, lambda f: f["type"] == "events" and f["events"][-1]["sequence"] >= 3)
    sequences = [e["sequence"] for f in frames if f["type"] == "events" for e in f["events"]]
    assert sequences == [1, 2, 3]
    await ws.disconnect()

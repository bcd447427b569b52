"""Live fan-out per process (issue 26 §1): 50 watchers of one run on two server processes.

The process joins a run's channel group once, whatever the number of its sockets (so Redis
holds two members for 50 watchers), and every watcher still gets every event exactly once and
in order while doorbells are lost: the channel layer's capacity at its floor (10) with one
process frozen (SIGSTOP) long enough for its queue to overflow, and Redis killed and
restarted mid-stream. The database is the record; heartbeats (1 s here) catch up.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import redis
from asgiref.sync import sync_to_async

from delegation.client import event
from delegation.models import Run
from tests.support.tcp_clients import RecordingRunner, make_runner, stored_events

pytestmark = [
    pytest.mark.usefixtures("close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres(redis=True),
    pytest.mark.timeout(180),
]

WATCHERS_PER_PROCESS = 25
TOTAL = 240


async def _emit(stream, start: int, count: int):
    for i in range(start, start + count, 4):
        await stream.emit(*[event("text", text=f"e{n}") for n in range(i, i + 4)])


async def test_it_delivers_every_event_once_in_order_to_50_watchers_on_two_processes(
    daphne_factory, private_redis, live_clients, operator_token
):
    env = {
        "REDIS_URL": private_redis.url,
        "CHANNEL_CAPACITY": 10,
        "LIVE_HEARTBEAT_SECONDS": 1,
        "OUTBOX_RESEND_SECONDS": 1,
        "LIVE_MAX_SOCKETS_PER_USER": 100,
    }
    a, b = daphne_factory(**env), daphne_factory(**env)
    token = await sync_to_async(make_runner)("fanout-runner")
    async with RecordingRunner(a.ws_url, token) as runner:
        await runner.client.open_run("conv-fan", "fan-run")
        run_pk = (await sync_to_async(Run.objects.get)(run_id="fan-run")).pk
        watchers = []
        for server in (a, b):
            url = f"ws://127.0.0.1:{server.port}/ws/live/"
            for _ in range(WATCHERS_PER_PROCESS):
                watchers.append(await live_clients(url, operator_token, reconnect=True))
        for watcher in watchers:
            await watcher.subscribe("fan-run")
        stream = runner.client.stream("fan-run")
        await _emit(stream, 0, 40)

        # One membership per process, not per watcher.
        client = redis.Redis(port=private_redis.port, socket_timeout=5)
        try:
            members = client.zrange(f"asgi:group:run.{run_pk}", 0, -1)
        finally:
            client.close()
        assert len(members) == 2, members

        # B frozen: its queue on Redis overflows capacity 10 and the rest is dropped.
        os.kill(b.process.pid, signal.SIGSTOP)
        try:
            await _emit(stream, 40, 80)
        finally:
            os.kill(b.process.pid, signal.SIGCONT)
        # Redis killed mid-stream, and back: memberships and queued doorbells are gone.
        await asyncio.to_thread(private_redis.stop, True)
        await _emit(stream, 120, 40)
        await asyncio.to_thread(private_redis.start)
        await _emit(stream, 160, TOTAL - 160)

    events = await sync_to_async(stored_events)("fan-run")
    texts = [e["text"] for e in events if e["runner_index"] is not None]
    assert texts == [f"e{n}" for n in range(TOTAL)]
    head = events[-1]["sequence"]
    for number, watcher in enumerate(watchers):
        await watcher.wait_until(
            lambda w=watcher: w.last_sequence("fan-run") >= head, 20, f"watcher {number}"
        )
    for number, watcher in enumerate(watchers):
        assert watcher.sequences("fan-run") == list(range(1, head + 1)), number

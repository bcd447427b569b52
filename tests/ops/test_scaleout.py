"""Several server processes sharing PostgreSQL and Redis (SPEC §8, issue 6).

Two real daphne processes, A and B, against the test database and the Redis channel layer: a
runner (the SDK) holds its socket on A while an operator watches on B's live socket and acts
through B's REST API. The live heartbeat and the outbox poll are set far beyond every wait
here, so what arrives in time arrived through the cross-process doorbell, not a fallback.

Runs only with ``DATABASE_URL`` on PostgreSQL and ``REDIS_URL`` set (.ci/run's second pass).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from delegation.client import event
from tests.support.tcp_clients import (
    RecordingRunner,
    api,
    assert_gap_free,
    eventually,
    make_runner,
    run_row,
    stored_events,
)


def scale_out_backends() -> bool:
    engine = settings.DATABASES["default"]["ENGINE"]
    return engine == "django.db.backends.postgresql" and bool(settings.REDIS_URL)


pytestmark = [
    pytest.mark.usefixtures("close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    # Several server processes need PostgreSQL and Redis.
    pytest.mark.postgres(redis=True),
]

# Far beyond every bound below: only the doorbell can deliver in time.
SLOW_FALLBACKS = {"LIVE_HEARTBEAT_SECONDS": 60, "OUTBOX_RESEND_SECONDS": 60}
PROMPT = 5.0  # seconds: a doorbell across processes, with slack for a loaded machine


def live_url(server) -> str:
    return f"ws://127.0.0.1:{server.port}/ws/live/"


async def test_it_shares_one_gap_free_stream_and_routes_operator_actions_across_two_processes(
    daphne_factory, live_clients, operator_token
):
    a = daphne_factory(**SLOW_FALLBACKS)
    b = daphne_factory(**SLOW_FALLBACKS)
    token = await sync_to_async(make_runner)("scale-runner")
    operator = operator_token

    async with RecordingRunner(a.ws_url, token) as runner:
        c = runner.client
        await c.open_run("conv-scale", "scale-root")
        steered = await c.child_start(
            "scale-root", "ext", 1, {"requestId": "c1", "profile": "worker", "message": "steer me"}
        )
        leased = await c.child_start(
            "scale-root",
            "ext",
            1,
            {"requestId": "c2", "profile": "worker", "message": "lease", "leaseId": "scale-lease"},
            lease_id="scale-lease",
        )
        await runner.wait_command("child.execute", PROMPT, count=2)

        watcher = await live_clients(live_url(b), operator)
        for run_id in ("scale-root", steered.run_id, leased.run_id):
            await watcher.subscribe(run_id)

        # Appends on both processes at once: the runner's events through A, the operator's
        # steers and the lease release (a server event on the root) through B.
        acked: dict[tuple[str, str], float] = {}

        async def produce(run_id: str, count: int):
            stream = c.stream(run_id)
            for start in range(0, count, 5):
                texts = [f"{run_id} {i}" for i in range(start, start + 5)]
                await stream.emit(*[event("text", t) for t in texts])
                now = time.monotonic()
                for text in texts:
                    acked[(run_id, text)] = now
                await asyncio.sleep(0.01)

        producers = [
            asyncio.create_task(produce("scale-root", 200)),
            asyncio.create_task(produce(steered.run_id, 150)),
        ]
        steer_answered = {}
        for number in range(8):
            request_id = f"op-steer-{number}"
            status, body = await asyncio.to_thread(
                api,
                b.http_url,
                "POST",
                f"/api/runs/{steered.run_id}/steer",
                operator,
                {"requestId": request_id, "message": f"steer {number}"},
            )
            assert (status, body) == (200, {"outcome": "injected"}), body
            steer_answered[request_id] = time.monotonic()
            await asyncio.sleep(0.05)
        status, leases = await asyncio.to_thread(
            api, b.http_url, "GET", "/api/leases?lease_id=scale-lease", operator
        )
        assert status == 200 and len(leases["items"]) == 1, leases
        status, released = await asyncio.to_thread(
            api, b.http_url, "POST", f"/api/leases/{leases['items'][0]['id']}/release", operator
        )
        assert status == 200 and released["state"] == "released", released
        release_answered = time.monotonic()
        async with asyncio.timeout(60):
            await asyncio.gather(*producers)

        status, report = await asyncio.to_thread(
            api,
            b.http_url,
            "POST",
            f"/api/runs/{steered.run_id}/cancel",
            operator,
            {"reason": "operator on B"},
        )
        assert status == 200 and report["outcome"] == "requested", report
        cancel_answered = time.monotonic()

        # Every command B recorded reached the runner on A through the doorbell.
        for request_id, answered in steer_answered.items():
            arrived = await runner.wait_command("run.steer", PROMPT, requestId=request_id)
            assert arrived - answered < PROMPT
        arrived = await runner.wait_command("lease.revoked", PROMPT, leaseId="scale-lease")
        assert arrived - release_answered < PROMPT
        arrived = await runner.wait_command("run.cancel", PROMPT, runId=leased.run_id)
        assert arrived - release_answered < PROMPT
        arrived = await runner.wait_command("run.cancel", PROMPT, runId=steered.run_id)
        assert arrived - cancel_answered < PROMPT
        assert [p["message"] for _, p in runner.received("run.steer")] == [
            f"steer {n}" for n in range(8)
        ]
        # The runner's cancel handler confirmed both cancels from A.
        for run_id in (steered.run_id, leased.run_id):
            await eventually(
                lambda run_id=run_id: run_row(run_id)["status"] == "cancelled",
                PROMPT,
                f"{run_id} cancelled",
            )
        await c.finish("scale-root", output="done")

    # The record: one gap-free order per run, holding both processes' appends.
    root_events = await sync_to_async(stored_events)("scale-root")
    steered_events = await sync_to_async(stored_events)(steered.run_id)
    leased_events = await sync_to_async(stored_events)(leased.run_id)
    for run_id, events in (
        ("scale-root", root_events),
        (steered.run_id, steered_events),
        (leased.run_id, leased_events),
    ):
        assert_gap_free(events, run_id)
    assert [e["text"] for e in root_events if e["runner_index"] is not None] == [
        f"scale-root {i}" for i in range(200)
    ]
    assert [e["kind"] for e in root_events if e["runner_index"] is None] == ["lease-released"]
    runner_texts = [e["text"] for e in steered_events if e["runner_index"] is not None]
    assert runner_texts == [f"{steered.run_id} {i}" for i in range(150)]
    assert [e["text"] for e in steered_events if e["kind"] == "steer"] == [
        f"steer {n}" for n in range(8)
    ]
    assert [e["kind"] for e in steered_events if e["runner_index"] is None] == ["steer"] * 8 + [
        "cancel-requested"
    ]
    assert [e["kind"] for e in leased_events] == ["cancel-requested"]
    first_steer = next(i for i, e in enumerate(steered_events) if e["kind"] == "steer")
    last_steer = max(i for i, e in enumerate(steered_events) if e["kind"] == "steer")
    # The steers really were interleaved with the runner's events, not appended after them.
    assert any(e["runner_index"] for e in steered_events[first_steer:last_steer]), [
        (e["kind"], e["runner_index"]) for e in steered_events
    ]

    # B's live socket saw exactly that record, each run once, in order, and promptly.
    for run_id, events in (
        ("scale-root", root_events),
        (steered.run_id, steered_events),
        (leased.run_id, leased_events),
    ):
        head = events[-1]["sequence"]
        await watcher.wait_until(
            lambda run_id=run_id, head=head: watcher.last_sequence(run_id) >= head,
            PROMPT,
            f"{run_id} up to {head} on B",
        )
        seen = [(e["sequence"], e["kind"], e.get("text")) for e in watcher.events(run_id)]
        assert seen == [(e["sequence"], e["kind"], e["text"]) for e in events], run_id
    for run_id in ("scale-root", steered.run_id):
        times = watcher.event_times(run_id)
        lags = [
            times[e["sequence"]] - acked[(run_id, e["text"])]
            for e in (root_events if run_id == "scale-root" else steered_events)
            if e["runner_index"] is not None
        ]
        assert max(lags) < PROMPT, f"{run_id}: an event took {max(lags):.2f}s from A to B"
    final = [f["run"] for f in watcher.frames if f["type"] == "run"]
    assert {r["runId"]: r["status"] for r in final}[steered.run_id] == "cancelled"

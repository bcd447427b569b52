"""``/metrics`` (SPEC §10): parsed with prometheus-client's own parser, the figures match what
the test did; open to loopback and admin API tokens only; summed across server processes."""

from __future__ import annotations

import json
import urllib.request

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from delegation import webhooks
from delegation.client import event
from delegation.services import webhooks as alerts
from delegation.services.run_actions import Actor
from tests.support.personas import api_token, session_cookie
from tests.support.tcp_clients import LiveClient, RecordingRunner, make_runner
from tests.support.webhook_receiver import Receiver

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_connections"),
]
adb = database_sync_to_async


def parse(text: str) -> dict[tuple, float]:
    """Every sample as {(sample name, sorted labels): value}."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def scrape(**extra) -> dict[tuple, float]:
    response = Client().get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return parse(response.content.decode())


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before, after, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


async def test_it_reports_what_happened_in_prometheus_text_format(
    runner, make_client, operator, admin
):
    before = await adb(scrape)()

    # A watcher on the live socket, subscribed before the events are appended: they reach it
    # as pushes.
    cookie = await adb(session_cookie)(operator)
    from canopy.asgi import application

    watcher = WebsocketCommunicator(
        application,
        "/ws/live/",
        # A browser always sends Host; the live gate compares Origin with it exactly.
        headers=[(b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1"), (b"cookie", cookie)],
    )
    assert (await watcher.connect(timeout=10))[0]
    assert json.loads(await watcher.receive_from(5))["type"] == "hello"

    await runner.open("r-busy")
    await watcher.send_to(text_data=json.dumps({"type": "subscribe", "runId": "r-busy"}))
    for frame in range(3):
        await runner.emit("r-busy", [f"e{frame}.{i}" for i in range(10)], start=frame * 10 + 1)
    pushed = 0
    while pushed < 30:
        message = json.loads(await watcher.receive_from(5))
        if message["type"] == "events":
            pushed = message["events"][-1]["sequence"]

    await runner.open("r-fails")
    await runner.finish("r-fails", error="boom")
    await runner.open("r-done")
    await runner.finish("r-done", output="ok")
    # Two refusals: a frame with a gap (−32602), and a handshake with a bad token (4401).
    await runner.error("run.event", {"runId": "r-busy", "from": 99, "events": [{"kind": "text"}]})
    await make_client("not-a-token", register=False)

    with Receiver() as receiver:

        def configure_and_exceed():
            alerts.do_create_webhook(
                Actor.for_user(admin, via="api"), url=receiver.url, kinds=["budget-exceeded"]
            )
            with transaction.atomic():
                alerts.enqueue_alert("budget-exceeded", {"runId": "r-busy", "limit": "maxCostUsd"})

        await adb(configure_and_exceed)()
        assert await webhooks.deliver_due() == ["delivered"]

    after = await adb(scrape)()
    await watcher.disconnect()
    closed = await adb(scrape)()

    # State, read from the database at scrape time.
    assert value(after, "canopy_runs", status="running") == 1
    assert value(after, "canopy_runs", status="failed") == 1
    assert value(after, "canopy_runs", status="succeeded") == 1
    assert value(after, "canopy_runs", status="lost") == 0
    assert value(after, "canopy_runners", state="connected") == 1
    assert value(after, "canopy_webhook_deliveries_stored", state="delivered") == 1
    assert value(after, "canopy_webhook_deliveries_stored", state="pending") == 0
    # Counters and histograms, as increases over this test.
    assert delta(before, after, "canopy_events_stored_total", origin="runner") == 30
    assert delta(before, after, "canopy_ingest_seconds_count") == 4  # 3 stored, 1 refused
    assert delta(before, after, "canopy_runner_refusals_total", code="-32602") == 1
    assert delta(before, after, "canopy_runner_refusals_total", code="4401") == 1
    assert delta(before, after, "canopy_budget_stops_total") == 1
    assert delta(before, after, "canopy_webhook_deliveries_total", outcome="delivered") == 1
    assert delta(before, after, "canopy_push_latency_seconds_count") >= 1
    assert delta(before, after, "canopy_live_sockets") == 1
    assert delta(after, closed, "canopy_live_sockets") == -1
    # Histograms carry their buckets (what Grafana's histogram_quantile needs).
    assert value(after, "canopy_ingest_seconds_bucket", le="+Inf") == value(
        after, "canopy_ingest_seconds_count"
    )


def test_it_opens_metrics_to_loopback_and_admin_tokens_only(viewer, operator, admin):
    client = Client()
    remote = {"REMOTE_ADDR": "203.0.113.7"}
    refused = client.get("/metrics", **remote)
    assert refused.status_code == 403
    assert "loopback" in refused.content.decode() and "admin" in refused.content.decode()
    for person in (viewer, operator):
        token = api_token(person)
        answer = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}", **remote)
        assert answer.status_code == 403, person
    assert (
        client.get("/metrics", HTTP_AUTHORIZATION="Bearer cna_wrong", **remote).status_code == 403
    )
    admitted = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {api_token(admin)}", **remote)
    assert admitted.status_code == 200
    assert ("canopy_runs", (("status", "running"),)) in parse(admitted.content.decode())

    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    # A proxy on this machine that says where the request came from: not loopback.
    forwarded = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.4")
    assert forwarded.status_code == 403
    assert client.post("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 405


def http_scrape(server) -> dict[tuple, float]:
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as response:
        return parse(response.read().decode())


async def test_it_sums_counters_across_two_server_processes(daphne_factory, tmp_path, viewer):
    shared = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "LIVE_HEARTBEAT_SECONDS": 60}
    a = await adb(daphne_factory)(**shared)
    b = await adb(daphne_factory)(**shared)
    token_a, token_b = await adb(make_runner)("metrics-a"), await adb(make_runner)("metrics-b")
    viewer_token = await adb(api_token)(viewer)

    watchers = []
    try:
        async with (
            RecordingRunner(a.ws_url, token_a) as on_a,
            RecordingRunner(b.ws_url, token_b) as on_b,
        ):
            for runner, run_id, frames in ((on_a, "run-a", 3), (on_b, "run-b", 2)):
                await runner.client.open_run(f"conv-{run_id}", run_id)
                stream = runner.client.stream(run_id)
                for frame in range(frames):
                    await stream.emit(*[event("text", f"{frame}.{i}") for i in range(10)])
            for server in (a, b):
                live = LiveClient(f"ws://127.0.0.1:{server.port}/ws/live/", viewer_token)
                watchers.append(await live.connect())

            for server in (a, b):
                samples = await adb(http_scrape)(server)
                # 30 events stored by A's process and 20 by B's, summed by either.
                assert value(samples, "canopy_events_stored_total", origin="runner") == 50
                assert value(samples, "canopy_ingest_seconds_count") >= 2
                assert value(samples, "canopy_live_sockets") == 2
                assert value(samples, "canopy_runs", status="running") == 2
                assert value(samples, "canopy_runners", state="connected") == 2

        # B dies with a live socket open: its counts stay in the sum (a counter never goes
        # back), its open socket does not.
        await adb(b.stop)(kill=True)
        after = await adb(http_scrape)(a)
        assert value(after, "canopy_events_stored_total", origin="runner") == 50
        assert value(after, "canopy_live_sockets") == 1
    finally:
        for watcher in watchers:
            await watcher.close()

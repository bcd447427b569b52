"""Alerts (SPEC §10): webhooks against a real local HTTP receiver.

Deliveries are stored with the change that causes them, signed with HMAC-SHA256, retried with
backoff and given up after their time; the sender never touches ingest. The suite turns the
in-process upkeep loop off (conftest), so these tests call the sender's ``deliver_due`` (what
the loop calls) themselves; the last test lets a real server's own loop send.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.db import transaction
from django.test import Client
from django.utils import timezone

from canopy.serving import free_port
from delegation import webhooks
from delegation.errors import RpcError
from delegation.models import (
    ALERT_KINDS,
    AuditEntry,
    Runner,
    Webhook,
    WebhookAttempt,
    WebhookDelivery,
)
from delegation.services import sweep
from delegation.services import webhooks as alerts
from delegation.services.run_actions import Actor
from tests.support.personas import api_token, signed_in
from tests.support.tcp_clients import api
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)
adb = database_sync_to_async

SECRET = "s3cret-s3cret-s3cret"


def expected_signature(secret: str, body: bytes) -> str:
    """Written from the README's description, not with the code under test."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def make_hook(admin, url: str, kinds, secret: str = SECRET) -> Webhook:
    actor = Actor.for_user(admin, via="api")
    return alerts.do_create_webhook(actor, url=url, kinds=list(kinds), secret=secret).webhook


def deliveries(hook=None) -> list[WebhookDelivery]:
    rows = WebhookDelivery.objects.order_by("pk")
    return list(rows.filter(webhook=hook) if hook is not None else rows)


def attempts(delivery: WebhookDelivery) -> list[tuple[int | None, str]]:
    return [(a.status_code, a.error) for a in WebhookAttempt.objects.filter(delivery=delivery)]


async def fail_a_run(runner, run_id: str, error: str = "boom"):
    await runner.open(run_id)
    await runner.finish(run_id, error=error)


async def test_it_signs_each_delivery_so_the_receiver_verifies_it_with_the_secret(runner, admin):
    with Receiver() as receiver:
        await adb(make_hook)(admin, receiver.url, ["run-failed"])
        await fail_a_run(runner, "r-fails", "tool crashed")
        # Stored with the run's failure, before anything was sent.
        [stored] = await adb(deliveries)()
        assert stored.state == "pending" and receiver.requests == []

        assert await webhooks.deliver_due() == ["delivered"]

        [request] = receiver.requests
        assert request.headers["x-canopy-signature"] == expected_signature(SECRET, request.body)
        assert request.headers["x-canopy-signature"] != expected_signature(
            "another-secret-entirely", request.body
        )
        assert request.headers["content-type"] == "application/json"
        assert request.headers["x-canopy-event"] == "run-failed"
        body = json.loads(request.body)
        assert body["kind"] == "run-failed"
        assert body["id"] == request.headers["x-canopy-delivery"] == stored.delivery_id
        assert body["data"]["runId"] == "r-fails"
        assert body["data"]["error"] == "tool crashed"
        assert body["data"]["runnerId"] == "runner-a"
        assert request.body == stored.body.encode()

    [sent] = await adb(deliveries)()
    assert sent.state == "delivered" and sent.delivered_at is not None
    assert await adb(attempts)(sent) == [(200, "")]


async def test_it_retries_a_500_with_backoff_until_the_receiver_answers_2xx(
    runner, admin, settings
):
    settings.WEBHOOK_RETRY_FIRST_SECONDS = 0.3
    with Receiver(statuses=[500, 503, 200]) as receiver:
        await adb(make_hook)(admin, receiver.url, ["run-failed"])
        await fail_a_run(runner, "r-retried")
        outcomes = []
        deadline = time.monotonic() + 15
        while "delivered" not in outcomes and time.monotonic() < deadline:
            outcomes += await webhooks.deliver_due()
            await asyncio.sleep(0.02)
        assert outcomes == ["retry", "retry", "delivered"]

        first, second, third = receiver.requests
        # Backoff: 0.3 s after the first failure, twice that after the second.
        assert second.at - first.at >= 0.3
        assert third.at - second.at >= 0.6
        # Every retry is the same delivery, byte for byte.
        assert first.body == second.body == third.body
        assert {r.headers["x-canopy-signature"] for r in receiver.requests} == {
            expected_signature(SECRET, first.body)
        }

    [delivery] = await adb(deliveries)()
    assert delivery.state == "delivered" and delivery.attempts == 3
    logged = await adb(attempts)(delivery)
    assert [status for status, _ in logged] == [500, 503, 200]
    assert logged[0][1].startswith("HTTP 500") and logged[2][1] == ""


def test_it_doubles_the_backoff_up_to_its_cap(settings):
    settings.WEBHOOK_RETRY_FIRST_SECONDS = 10
    settings.WEBHOOK_RETRY_MAX_SECONDS = 3600
    assert [alerts.backoff_seconds(n) for n in range(1, 6)] == [10, 20, 40, 80, 160]
    assert alerts.backoff_seconds(20) == 3600


async def test_it_gives_a_delivery_up_when_the_receiver_stays_down(runner, admin, settings):
    settings.WEBHOOK_RETRY_FIRST_SECONDS = 0.2
    settings.WEBHOOK_GIVE_UP_SECONDS = 1.0
    down = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    await adb(make_hook)(admin, down, ["run-failed"])
    await fail_a_run(runner, "r-unheard")
    outcomes = []
    deadline = time.monotonic() + 10
    while "given-up" not in outcomes and time.monotonic() < deadline:
        outcomes += await webhooks.deliver_due()
        await asyncio.sleep(0.02)
    assert outcomes[-1] == "given-up" and set(outcomes[:-1]) == {"retry"}
    assert len(outcomes) >= 2
    [delivery] = await adb(deliveries)()
    assert delivery.state == "given-up" and delivery.next_attempt_at is None
    logged = await adb(attempts)(delivery)
    assert all(status is None and "Connect" in error for status, error in logged), logged
    # Nothing more is tried once given up.
    assert await webhooks.deliver_due() == []


async def _append_frames(runner, run_id: str, frames: int, per_frame: int) -> float:
    await runner.open(run_id)
    began = time.perf_counter()
    for frame in range(frames):
        texts = [f"{run_id} {frame}.{i}" for i in range(per_frame)]
        await runner.emit(run_id, texts, start=frame * per_frame + 1)
    return time.perf_counter() - began


async def test_it_keeps_ingest_free_of_http_while_a_receiver_hangs(runner, admin, settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = 20
    frames, per_frame = 40, 25
    baseline = await _append_frames(runner, "r-baseline", frames, per_frame)

    with Receiver(hang=True) as receiver:
        await adb(make_hook)(admin, receiver.url, ALERT_KINDS)
        await fail_a_run(runner, "r-doomed")
        # The sender runs on this event loop, as in a server process, and is stuck on the
        # receiver for as long as the ingest below takes.
        sender = asyncio.create_task(webhooks.deliver_due())
        deadline = time.monotonic() + 10
        while not receiver.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert len(receiver.requests) == 1

        during = await _append_frames(runner, "r-during", frames, per_frame)

        assert not sender.done(), "the sender should still be waiting on the receiver"
        # Ingest stored no delivery and opened no connection: the only one is the sender's.
        assert len(await adb(deliveries)()) == 1
        assert receiver.connections == 1
        assert during <= 3 * baseline + 0.5, (during, baseline)
        receiver.released.set()
        assert await asyncio.wait_for(sender, 30) == ["retry"]


async def test_it_stores_one_delivery_for_a_failed_run_and_one_for_a_lost_runner(runner, admin):
    failures = await adb(make_hook)(
        admin, "https://alerts.example/f", ["run-failed", "runner-lost"]
    )
    lost_runs = await adb(make_hook)(admin, "https://alerts.example/l", ["run-lost"])

    await runner.open("r-fine")
    await runner.finish("r-fine", output="all good")
    await fail_a_run(runner, "r-broken")
    await runner.open("r-stranded")
    await runner.close()

    def lose():
        deadline = time.monotonic() + 10
        while Runner.objects.get(name="runner-a").connected and time.monotonic() < deadline:
            time.sleep(0.02)
        report = sweep.sweep(now=timezone.now() + timedelta(hours=1))
        assert report.lost_runners == ["runner-a"]
        # A second sweep finds nothing new to report.
        assert sweep.sweep(now=timezone.now() + timedelta(hours=1)).lost_runners == []

    await adb(lose)()

    sent = await adb(deliveries)(failures)
    assert [d.kind for d in sent] == ["run-failed", "runner-lost"]
    assert json.loads(sent[0].body)["data"]["runId"] == "r-broken"
    lost = json.loads(sent[1].body)["data"]
    assert lost["runnerId"] == "runner-a" and lost["runsLost"] == ["r-stranded"]
    [run_lost] = await adb(deliveries)(lost_runs)
    assert run_lost.kind == "run-lost"
    assert json.loads(run_lost.body)["data"]["runId"] == "r-stranded"


def test_it_accepts_https_anywhere_and_plain_http_only_to_loopback():
    for url in (
        "https://hooks.example.com/canopy",
        "http://127.0.0.1:9000/x",
        "http://127.8.9.10/x",
        "http://localhost:8080/",
        "http://[::1]:9000/x",
    ):
        assert alerts.check_url(url) == url
    for url, says in (
        ("http://hooks.example.com/canopy", "http is allowed only to loopback"),
        ("http://10.0.0.5/x", "http is allowed only to loopback"),
        ("ftp://127.0.0.1/x", "scheme must be https"),
        ("https://user:pw@hooks.example.com/", "must not carry credentials"),
        ("https:///nohost", "has no host"),
        ("", "required"),
    ):
        with pytest.raises(RpcError) as refused:
            alerts.check_url(url)
        assert refused.value.message.startswith("url: ") and says in refused.value.message


def _bearer(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def test_it_configures_webhooks_and_sends_a_test_through_rest_for_admins_only(admin, operator):
    client = Client()
    admin_auth, operator_auth = _bearer(api_token(admin)), _bearer(api_token(operator))
    with Receiver() as receiver:
        body = {"url": receiver.url, "kinds": ["run-failed", "budget-exceeded"], "name": "ops"}
        refused = client.post("/api/webhooks", body, "application/json", **operator_auth)
        assert refused.status_code == 403
        assert client.get("/api/webhooks", **operator_auth).status_code == 403
        assert client.get("/api/webhook-deliveries", **operator_auth).status_code == 403

        created = client.post("/api/webhooks", body, "application/json", **admin_auth)
        assert created.status_code == 201, created.content
        hook = created.json()
        secret = hook["secret"]
        assert len(secret) >= 16 and hook["kinds"] == ["budget-exceeded", "run-failed"]
        listed = client.get("/api/webhooks", **admin_auth).json()["items"]
        assert [item["id"] for item in listed] == [hook["id"]]
        assert "secret" not in listed[0]

        assert client.post(f"/api/webhooks/{hook['id']}/test", **operator_auth).status_code == 403
        queued = client.post(f"/api/webhooks/{hook['id']}/test", **admin_auth)
        assert queued.status_code == 202, queued.content
        assert queued.json()["delivery"]["state"] == "pending"

        assert asyncio.run(webhooks.deliver_due()) == ["delivered"]
        [request] = receiver.requests
        assert json.loads(request.body)["kind"] == "test"
        assert request.headers["x-canopy-signature"] == expected_signature(secret, request.body)

        page = client.get(f"/api/webhook-deliveries?webhook={hook['id']}", **admin_auth).json()
        [item] = page["items"]
        assert item["kind"] == "test" and item["state"] == "delivered"
        assert [a["statusCode"] for a in item["attempts"]] == [200]
        assert item["body"].encode() == request.body

    for bad, says in (
        ({**body, "url": "http://hooks.example.com/x"}, "url"),
        ({**body, "kinds": ["run-finished"]}, "kinds"),
        ({**body, "secret": "short"}, "secret"),
        ({**body, "colour": "red"}, "colour: unknown field"),
    ):
        answer = client.post("/api/webhooks", bad, "application/json", **admin_auth)
        assert answer.status_code == 422, (bad, answer.content)
        assert says in answer.json()["error"]["message"]

    assert client.delete(f"/api/webhooks/{hook['id']}", **operator_auth).status_code == 403
    assert client.delete(f"/api/webhooks/{hook['id']}", **admin_auth).status_code == 204
    assert client.delete(f"/api/webhooks/{hook['id']}", **admin_auth).status_code == 404
    assert not Webhook.objects.exists() and not WebhookDelivery.objects.exists()
    audited = list(
        AuditEntry.objects.filter(target_type="webhook")
        .order_by("pk")
        .values_list("actor", "action", "outcome")
    )
    assert audited == [
        ("user:olga", "webhook-create", "refused: not an admin"),
        ("user:ada", "webhook-create", "created"),
        ("user:olga", "webhook-test", "refused: not an admin"),
        ("user:ada", "webhook-test", "queued"),
        ("user:olga", "webhook-delete", "refused: not an admin"),
        ("user:ada", "webhook-delete", "deleted"),
    ]


def test_it_configures_a_webhook_and_sends_a_test_from_the_admin(admin, operator):
    assert signed_in(operator).get("/admin/delegation/webhook/").status_code == 403
    client = signed_in(admin)
    with Receiver() as receiver:
        added = client.post(
            "/admin/delegation/webhook/add/",
            {"name": "pager", "url": receiver.url, "kinds": ["runner-lost"], "active": "on"},
            follow=True,
        )
        assert added.status_code == 200
        hook = Webhook.objects.get()
        assert hook.kinds == ["runner-lost"] and hook.created_by == "user:ada"
        # A secret was made and shown once.
        assert hook.secret in added.content.decode()

        refused = client.post(
            "/admin/delegation/webhook/add/",
            {"url": "http://hooks.example.com/", "kinds": ["runner-lost"]},
        )
        assert "http is allowed only to loopback" in refused.content.decode()

        sent = client.post(
            "/admin/delegation/webhook/",
            {"action": "send_test", "_selected_action": [str(hook.pk)]},
            follow=True,
        )
        assert "test delivery" in sent.content.decode() and "queued" in sent.content.decode()
        assert asyncio.run(webhooks.deliver_due()) == ["delivered"]
        [request] = receiver.requests
        assert json.loads(request.body)["kind"] == "test"
        assert request.headers["x-canopy-signature"] == expected_signature(
            hook.secret, request.body
        )

    delivery = WebhookDelivery.objects.get()
    page = client.get(f"/admin/delegation/webhookdelivery/{delivery.pk}/change/")
    assert page.status_code == 200 and "delivered" in page.content.decode()
    assert AuditEntry.objects.filter(action="webhook-test", via="admin").count() == 1


def test_it_sends_from_a_real_servers_upkeep_loop(daphne_factory, admin):
    server = daphne_factory(MAINTENANCE_INTERVAL_SECONDS=0.2)
    token = api_token(admin)
    with Receiver() as receiver:
        status, hook = api(
            server.http_url,
            "POST",
            "/api/webhooks",
            token,
            {"url": receiver.url, "kinds": ["run-lost"], "secret": SECRET},
        )
        assert status == 201, hook
        status, queued = api(server.http_url, "POST", f"/api/webhooks/{hook['id']}/test", token)
        assert status == 202, queued
        # Answered before anything was sent: the request only stored the delivery.
        assert queued["delivery"]["attempts"] == []
        [request] = receiver.wait_for(1, timeout=15)
        assert request.headers["x-canopy-signature"] == expected_signature(SECRET, request.body)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            _status, page = api(server.http_url, "GET", "/api/webhook-deliveries", token)
            if page["items"][0]["state"] == "delivered":
                break
            time.sleep(0.1)
        assert page["items"][0]["state"] == "delivered"


def test_it_stores_nothing_when_the_change_that_caused_the_alert_rolls_back(admin):
    make_hook(admin, "https://alerts.example/x", ["budget-warning"])
    with pytest.raises(RuntimeError), transaction.atomic():
        alerts.enqueue_alert("budget-warning", {"runId": "r1"})
        assert len(deliveries()) == 1
        raise RuntimeError("the budget write failed")
    assert deliveries() == []
    with pytest.raises(ValueError, match="kind: 'run-finished' is not an alert kind"):
        alerts.enqueue_alert("run-finished", {})


def test_it_changes_a_webhook_from_the_admin_keeping_its_secret_unless_given(admin):
    hook = make_hook(admin, "https://alerts.example/x", ["run-failed"])
    client = signed_in(admin)
    changed = client.post(
        f"/admin/delegation/webhook/{hook.pk}/change/",
        {
            "name": "renamed",
            "url": "https://alerts.example/y",
            "kinds": ["run-lost", "runner-lost"],
        },
        follow=True,
    )
    assert changed.status_code == 200
    hook.refresh_from_db()
    assert (hook.name, hook.url, hook.kinds, hook.active, hook.secret) == (
        "renamed",
        "https://alerts.example/y",
        ["run-lost", "runner-lost"],
        False,
        SECRET,
    )
    client.post(
        f"/admin/delegation/webhook/{hook.pk}/change/",
        {"url": hook.url, "kinds": ["run-lost"], "active": "on", "new_secret": "x" * 20},
    )
    hook.refresh_from_db()
    assert hook.secret == "x" * 20 and hook.active
    entries = AuditEntry.objects.filter(action="webhook-update").order_by("pk")
    assert [e.detail["secretRotated"] for e in entries] == [False, True]


def test_it_sends_from_the_separate_upkeep_command_too(admin):
    """UPKEEP_IN_PROCESS=false deployments run ``manage.py upkeep`` instead of the loop."""
    from io import StringIO

    from django.core.management import call_command

    with Receiver() as receiver:
        hook = make_hook(admin, receiver.url, ["run-failed"])
        alerts.do_send_test(Actor.for_user(admin, via="api"), hook)
        out = StringIO()
        call_command("upkeep", "--once", stdout=out)
        [request] = receiver.requests
        assert json.loads(request.body)["kind"] == "test"
    assert "webhook deliveries: ['delivered']" in out.getvalue()

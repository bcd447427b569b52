"""Deliveries and their bookkeeping: ``enqueue_alert`` stores one per subscribed webhook in the
transaction of the change it reports; the sender (``delegation.webhooks``, which does the HTTP)
claims due ones with ``claim_due`` and logs each POST with ``record_attempt``."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from delegation import metrics
from delegation.models import (
    ALERT_KINDS,
    DeliveryState,
    Run,
    Runner,
    Webhook,
    WebhookAttempt,
    WebhookDelivery,
)

TEST_KIND = "test"


def enqueue_alert(kind: str, payload: dict) -> list[WebhookDelivery]:
    """Store one delivery of ``kind`` for every active webhook subscribed to it.

    Call it inside the transaction that makes the change the alert reports (a run failing,
    a runner lost, a budget crossed): the deliveries commit or roll back with it, and the
    upkeep loop sends them after commit. ``payload`` must be JSON-serialisable.
    """
    if kind not in ALERT_KINDS:
        raise ValueError(f"kind: {kind!r} is not an alert kind ({', '.join(ALERT_KINDS)})")
    if kind == "budget-exceeded":
        transaction.on_commit(metrics.budget_stopped)
    # The webhook table is a handful of rows; filtering kinds here works on every backend.
    hooks = [hook for hook in Webhook.objects.filter(active=True) if kind in hook.kinds]
    return [store_delivery(hook, kind, payload) for hook in hooks]


def store_delivery(hook: Webhook, kind: str, payload: dict) -> WebhookDelivery:
    now = timezone.now()
    delivery_id = uuid.uuid4().hex
    body = json.dumps(
        {"id": delivery_id, "kind": kind, "createdAt": now.isoformat(), "data": payload},
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    )
    return WebhookDelivery.objects.create(
        webhook=hook,
        delivery_id=delivery_id,
        kind=kind,
        body=body,
        created_at=now,
        next_attempt_at=now,
    )


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def run_payload(run: Run) -> dict:
    """What a run alert says about the run."""
    return {
        "runId": run.run_id,
        "status": run.status,
        "error": run.error,
        "depth": run.depth,
        "profile": run.profile,
        "runnerId": run.runner.name,
        "parentRunId": run.parent.run_id if run.parent_id else None,
        "rootRunId": run.root.run_id if run.root_id else run.run_id,
        "createdAt": _iso(run.created_at),
        "finishedAt": _iso(run.finished_at),
    }


def run_finished(run: Run) -> None:
    """The alert for a run that just ended failed or lost (called by ``mark_finished``)."""
    kind = {"failed": "run-failed", "lost": "run-lost"}.get(run.status)
    if kind is not None:
        enqueue_alert(kind, run_payload(run))


def runner_lost(runner: Runner, lost_runs: list[str]) -> None:
    enqueue_alert(
        "runner-lost",
        {
            "runnerId": runner.name,
            "hostInstanceId": runner.host_instance_id,
            "disconnectedAt": _iso(runner.disconnected_at),
            "lostAt": _iso(runner.lost_at),
            "runsLost": lost_runs,
        },
    )


# --- The sender's bookkeeping (delegation.webhooks does the HTTP) --------------------------


@dataclass(frozen=True)
class Job:
    pk: int
    delivery_id: str
    kind: str
    url: str
    secret: str
    body: str


def _claim_seconds() -> float:
    # Long enough for the POST (connect + read timeouts) and its bookkeeping; a sender that
    # dies mid-way leaves the delivery to be claimed again after this.
    return 2 * settings.WEBHOOK_TIMEOUT_SECONDS + 30


def claim_due(limit: int, now=None) -> list[Job]:
    """Claim up to ``limit`` pending deliveries that are due, for this process to send.

    A claim moves ``next_attempt_at`` forward with a compare-and-set, so when every process
    runs the sender each delivery is sent by one of them (on SQLite and PostgreSQL alike).
    A webhook switched off keeps its deliveries pending until it is switched on again.
    """
    now = now or timezone.now()
    due = list(
        WebhookDelivery.objects.filter(
            state=DeliveryState.PENDING, next_attempt_at__lte=now, webhook__active=True
        )
        .order_by("next_attempt_at", "pk")
        .values_list("pk", "next_attempt_at")[:limit]
    )
    until = now + timedelta(seconds=_claim_seconds())
    claimed = [
        pk
        for pk, due_at in due
        if WebhookDelivery.objects.filter(
            pk=pk, state=DeliveryState.PENDING, next_attempt_at=due_at
        ).update(next_attempt_at=until)
    ]
    rows = WebhookDelivery.objects.filter(pk__in=claimed).select_related("webhook")
    return [
        Job(row.pk, row.delivery_id, row.kind, row.webhook.url, row.webhook.secret, row.body)
        for row in rows
    ]


def backoff_seconds(attempts: int) -> float:
    """Delay before the next try after ``attempts`` failed ones: doubling from the first."""
    first = settings.WEBHOOK_RETRY_FIRST_SECONDS
    return min(settings.WEBHOOK_RETRY_MAX_SECONDS, first * 2 ** max(0, attempts - 1))


def record_attempt(
    pk: int, *, started_at, duration_ms: int, status_code: int | None, error: str = ""
) -> str:
    """Log one POST and decide what follows: delivered, retry later, or given up."""
    now = timezone.now()
    with transaction.atomic():
        delivery = WebhookDelivery.objects.select_for_update().filter(pk=pk).first()
        if delivery is None or delivery.state != DeliveryState.PENDING:
            return "gone"
        delivery.attempts += 1
        WebhookAttempt.objects.create(
            delivery=delivery,
            number=delivery.attempts,
            started_at=started_at,
            duration_ms=max(0, duration_ms),
            status_code=status_code,
            error=error[:2000],
        )
        delivery.last_status = status_code
        delivery.last_error = error[:2000]
        if status_code is not None and 200 <= status_code < 300:
            outcome = "delivered"
            delivery.state = DeliveryState.DELIVERED
            delivery.delivered_at = now
            delivery.next_attempt_at = None
        else:
            deadline = delivery.created_at + timedelta(seconds=settings.WEBHOOK_GIVE_UP_SECONDS)
            following = now + timedelta(seconds=backoff_seconds(delivery.attempts))
            if now >= deadline:
                outcome = "given-up"
                delivery.state = DeliveryState.GIVEN_UP
                delivery.next_attempt_at = None
            else:
                outcome = "retry"
                # One last try at the deadline rather than none past the backoff.
                delivery.next_attempt_at = min(following, deadline)
        delivery.save()
        transaction.on_commit(lambda: metrics.webhook_outcome(outcome))
    return outcome

"""Reads for the admins' alerts page: webhooks, and recent deliveries with every attempt."""

from __future__ import annotations

from delegation.models import Webhook, WebhookAttempt, WebhookDelivery

RECENT_DELIVERIES = 50


def alerts_overview(limit: int = RECENT_DELIVERIES) -> dict:
    hooks = list(Webhook.objects.order_by("-created_at", "-id"))
    deliveries = list(
        WebhookDelivery.objects.select_related("webhook").order_by("-created_at", "-id")[:limit]
    )
    attempts: dict[int, list] = {}
    for attempt in WebhookAttempt.objects.filter(delivery__in=[d.pk for d in deliveries]).order_by(
        "delivery", "number"
    ):
        attempts.setdefault(attempt.delivery_id, []).append(attempt)
    return {
        "webhooks": hooks,
        "deliveries": [{"delivery": d, "attempts": attempts.get(d.pk, [])} for d in deliveries],
    }

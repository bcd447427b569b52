"""Reads of webhooks and their deliveries: the admins' alerts page and the REST API
(``/api/webhooks``, ``/api/webhook-deliveries``)."""

from __future__ import annotations

from delegation.models import Webhook, WebhookAttempt, WebhookDelivery

RECENT_DELIVERIES = 50


def attempts_of(delivery_pks) -> dict[int, list[WebhookAttempt]]:
    """Every attempt of these deliveries, by delivery pk, in the order they were made."""
    attempts: dict[int, list[WebhookAttempt]] = {}
    rows = WebhookAttempt.objects.filter(delivery__in=list(delivery_pks)).order_by(
        "delivery", "number"
    )
    for attempt in rows:
        attempts.setdefault(attempt.delivery_id, []).append(attempt)
    return attempts


def alerts_overview(limit: int = RECENT_DELIVERIES) -> dict:
    hooks = list(Webhook.objects.order_by("-created_at", "-id"))
    deliveries = list(
        WebhookDelivery.objects.select_related("webhook").order_by("-created_at", "-id")[:limit]
    )
    attempts = attempts_of(d.pk for d in deliveries)
    return {
        "webhooks": hooks,
        "deliveries": [{"delivery": d, "attempts": attempts.get(d.pk, [])} for d in deliveries],
    }


def get_webhook(pk: int) -> Webhook | None:
    return Webhook.objects.filter(pk=pk).first()


def webhook_keys():
    """Every webhook's pk, as a query the REST API pages by keyset."""
    return Webhook.objects.values("pk")


def webhooks_by_pk(pks) -> dict[int, Webhook]:
    return {hook.pk: hook for hook in Webhook.objects.filter(pk__in=list(pks))}


def delivery_keys(*, webhook: int | None = None, state: str | None = None, kind: str | None = None):
    """The pks of the deliveries matching the filters (None: any), as a query to page."""
    rows = WebhookDelivery.objects.all()
    if webhook is not None:
        rows = rows.filter(webhook_id=webhook)
    if state is not None:
        rows = rows.filter(state=state)
    if kind is not None:
        rows = rows.filter(kind=kind)
    return rows.values("pk")


def deliveries_by_pk(pks) -> dict[int, WebhookDelivery]:
    return {row.pk: row for row in WebhookDelivery.objects.filter(pk__in=list(pks))}

"""Webhooks (SPEC §10 "Alerts"): configure, delete, test, and the delivery log. Admins only."""

from typing import Literal

from django.http import Http404
from ninja import Query, Router, Schema, Status
from pydantic import Field

from dashboard.api.core import (
    DEFAULT_LIMIT,
    ApiError,
    ErrorOut,
    NoParams,
    actor_for,
    keyset_page,
    strict_query,
)
from dashboard.api.schemas.alerts import (
    DeliveryItem,
    DeliveryPage,
    WebhookBody,
    WebhookCreated,
    WebhookItem,
    WebhookPage,
)
from dashboard.api.schemas.common import IdParam, LimitParam, cursor_param
from delegation import roles
from delegation.models import ALERT_KINDS, DeliveryState, Webhook, WebhookDelivery
from delegation.selectors import alerts as reads
from delegation.services import webhooks

router = Router(tags=["alerts"])


ADMIN_READ = {401: ErrorOut, 403: ErrorOut, 422: ErrorOut}


ADMIN_ONE = {401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut}


ADMIN_ACT = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut}


SIGNATURE_DOC = (
    'Each delivery is a JSON POST `{"id", "kind", "createdAt", "data"}` with '
    "`X-Canopy-Signature: sha256=<hex HMAC-SHA256 of the raw body, keyed with the webhook's "
    "secret>`, `X-Canopy-Timestamp: <unix seconds when the attempt was sent>`, "
    '`X-Canopy-Timestamp-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<raw body>">` '
    "(check it and refuse old timestamps to refuse replays), `X-Canopy-Delivery: <id>` and "
    "`X-Canopy-Event: <kind>`; it is retried with exponential backoff until answered 2xx, or "
    "given up a day after it was stored. Only the status of an answer is kept, never its body. "
    "The url must be https to a public address or plain http to loopback: a name that is, or "
    "resolves to, a private, link-local, loopback (for https) or cloud metadata address is "
    "refused when saved (422) and again before every send."
)


def require_admin_reader(request) -> None:
    if not roles.can_admin(request.auth):
        raise ApiError(
            403,
            "forbidden",
            f"user {request.auth.get_username()!r} has role {roles.role_of(request.auth)}; "
            "webhooks need admin",
        )


def _iso(value):
    return value.isoformat() if value is not None else None


def webhook_item(hook: Webhook) -> dict:
    return {
        "id": hook.pk,
        "name": hook.name,
        "url": hook.url,
        "kinds": list(hook.kinds),
        "active": hook.active,
        "createdAt": hook.created_at.isoformat(),
        "createdBy": hook.created_by,
    }


def delivery_items(rows: list[WebhookDelivery]) -> list[dict]:
    attempts = {
        pk: [
            {
                "number": attempt.number,
                "startedAt": attempt.started_at.isoformat(),
                "durationMs": attempt.duration_ms,
                "statusCode": attempt.status_code,
                "error": attempt.error,
            }
            for attempt in made
        ]
        for pk, made in reads.attempts_of(row.pk for row in rows).items()
    }
    return [
        {
            "id": row.pk,
            "deliveryId": row.delivery_id,
            "webhook": row.webhook_id,
            "kind": row.kind,
            "state": row.state,
            "attempts": attempts.get(row.pk, []),
            "createdAt": row.created_at.isoformat(),
            "nextAttemptAt": _iso(row.next_attempt_at),
            "deliveredAt": _iso(row.delivered_at),
            "body": row.body,
        }
        for row in rows
    ]


def find_webhook(id: int) -> Webhook:  # noqa: A002
    hook = reads.get_webhook(id)
    if hook is None:
        raise Http404(f"id: no webhook {id}")
    return hook


class WebhookFilters(Schema):
    cursor: cursor_param("w") = None
    limit: LimitParam = DEFAULT_LIMIT


@router.get(
    "/webhooks",
    response={200: WebhookPage, **ADMIN_READ},
    summary="List webhooks, newest first (admin)",
    description=SIGNATURE_DOC,
)
@strict_query(WebhookFilters)
def list_webhooks(request, filters: Query[WebhookFilters]):
    require_admin_reader(request)
    page = keyset_page(reads.webhook_keys(), "w", filters.cursor, filters.limit)
    hooks = reads.webhooks_by_pk(r["pk"] for r in page["items"])
    return {"items": [webhook_item(hooks[r["pk"]]) for r in page["items"]], "next": page["next"]}


@router.post(
    "/webhooks",
    response={201: WebhookCreated, **ADMIN_ACT},
    summary="Create a webhook (admin, audited)",
    description=SIGNATURE_DOC,
)
@strict_query(NoParams)
def create_webhook(request, body: WebhookBody):
    created = webhooks.do_create_webhook(
        actor_for(request),
        url=body.url,
        kinds=list(body.kinds),
        secret=body.secret,
        active=body.active,
        name=body.name,
    )
    return Status(201, {**webhook_item(created.webhook), "secret": created.secret})


@router.get(
    "/webhooks/{id}",
    response={200: WebhookItem, **ADMIN_ONE},
    summary="One webhook (admin)",
)
@strict_query(NoParams)
def get_webhook(request, id: IdParam):  # noqa: A002
    require_admin_reader(request)
    return webhook_item(find_webhook(id))


@router.delete(
    "/webhooks/{id}",
    response={204: None, **ADMIN_ONE},
    summary="Delete a webhook and its delivery log (admin, audited)",
)
@strict_query(NoParams)
def delete_webhook(request, id: IdParam):  # noqa: A002
    actor = actor_for(request)
    hook = reads.get_webhook(id)
    if hook is None:
        # An outsider learns nothing from a 404 they were not allowed to see.
        webhooks.require_admin(actor, "webhook-delete", str(id))
        raise Http404(f"id: no webhook {id}")
    webhooks.do_delete_webhook(actor, hook)
    return Status(204, None)


class TestQueued(Schema):
    delivery: DeliveryItem


@router.post(
    "/webhooks/{id}/test",
    response={202: TestQueued, **ADMIN_ACT},
    summary="Queue a test delivery (admin, audited)",
    description="Stores a delivery of kind `test` for this webhook (whatever its kinds); the "
    "upkeep loop sends it within a sweep interval. Poll `/webhook-deliveries?webhook=ID` for "
    "its attempts.",
)
@strict_query(NoParams)
def test_webhook(request, id: IdParam):  # noqa: A002
    actor = actor_for(request)
    hook = reads.get_webhook(id)
    if hook is None:
        webhooks.require_admin(actor, "webhook-test", str(id))
        raise Http404(f"id: no webhook {id}")
    delivery = webhooks.do_send_test(actor, hook)
    return Status(202, {"delivery": delivery_items([delivery])[0]})


class DeliveryFilters(Schema):
    webhook: IdParam = Field(default=None, description="Only this webhook's deliveries")
    state: Literal[tuple(DeliveryState.values)] = None  # type: ignore[valid-type]
    kind: Literal[(*ALERT_KINDS, webhooks.TEST_KIND)] = None  # type: ignore[valid-type]
    cursor: cursor_param("d") = None
    limit: LimitParam = DEFAULT_LIMIT


@router.get(
    "/webhook-deliveries",
    response={200: DeliveryPage, **ADMIN_READ},
    summary="List webhook deliveries with their attempts, newest first (admin)",
    description=SIGNATURE_DOC,
)
@strict_query(DeliveryFilters)
def list_deliveries(request, filters: Query[DeliveryFilters]):
    require_admin_reader(request)
    rows = reads.delivery_keys(webhook=filters.webhook, state=filters.state, kind=filters.kind)
    page = keyset_page(rows, "d", filters.cursor, filters.limit)
    pks = [r["pk"] for r in page["items"]]
    found = reads.deliveries_by_pk(pks)
    return {"items": delivery_items([found[pk] for pk in pks]), "next": page["next"]}

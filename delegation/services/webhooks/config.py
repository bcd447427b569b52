"""Admins configure webhooks: create, update, delete, and queue a test delivery. Each checks the
admin role first (a refusal is audited) and audits what it did."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.db import transaction

from delegation import roles
from delegation.errors import INVALID_PARAMS, PermissionRefused, RpcError
from delegation.models import (
    ALERT_KINDS,
    Webhook,
    WebhookDelivery,
)
from delegation.services.audit import audit
from delegation.services.identity import Actor
from delegation.services.webhooks.deliveries import TEST_KIND, store_delivery
from delegation.services.webhooks.targets import check_url

MIN_SECRET_CHARS = 16


def require_admin(actor: Actor, action: str, target_id: str) -> None:
    if actor.user is not None and roles.can_admin(actor.user):
        return
    # Audited in its own transaction so the refusal survives the caller's rollback.
    with transaction.atomic():
        audit(actor, action, "webhook", target_id, "refused: not an admin")
    role = roles.role_of(actor.user) if actor.user is not None else None
    raise PermissionRefused(f"{actor.label} has role {role or 'none'}; {action} needs admin")


def check_kinds(kinds) -> list[str]:
    if not isinstance(kinds, list | tuple) or not kinds:
        raise RpcError(INVALID_PARAMS, f"kinds: a non-empty list of {', '.join(ALERT_KINDS)}")
    for index, kind in enumerate(kinds):
        if kind not in ALERT_KINDS:
            raise RpcError(
                INVALID_PARAMS,
                f"kinds[{index}]: {kind!r} is not one of {', '.join(ALERT_KINDS)}",
            )
    return [kind for kind in ALERT_KINDS if kind in kinds]


def check_secret(secret: str | None) -> str:
    if secret is None or secret == "":
        return secrets.token_urlsafe(32)
    if len(secret) < MIN_SECRET_CHARS or len(secret) > 256:
        raise RpcError(
            INVALID_PARAMS,
            f"secret: {MIN_SECRET_CHARS} to 256 characters (omit it to have one made)",
        )
    return secret


def check_name(name: str) -> str:
    if len(name) > 128:
        raise RpcError(INVALID_PARAMS, "name: at most 128 characters")
    return name


@dataclass
class Created:
    webhook: Webhook
    secret: str


def do_create_webhook(
    actor: Actor,
    *,
    url: str,
    kinds: list[str],
    secret: str | None = None,
    active: bool = True,
    name: str = "",
) -> Created:
    """A new webhook; ``secret`` is made when not given and returned so it can be shown once."""
    require_admin(actor, "webhook-create", url if isinstance(url, str) else "")
    url = check_url(url)
    kinds = check_kinds(kinds)
    secret = check_secret(secret)
    name = check_name(name)
    with transaction.atomic():
        hook = Webhook.objects.create(
            name=name, url=url, secret=secret, kinds=kinds, active=active, created_by=actor.label
        )
        audit(
            actor,
            "webhook-create",
            "webhook",
            str(hook.pk),
            "created",
            detail={"url": url, "kinds": kinds, "active": active, "name": name},
        )
    return Created(hook, secret)


def do_update_webhook(
    actor: Actor,
    webhook: Webhook,
    *,
    url: str,
    kinds: list[str],
    active: bool,
    name: str = "",
    secret: str | None = None,
) -> Webhook:
    """Change a webhook; a ``secret`` of None keeps the current one."""
    require_admin(actor, "webhook-update", str(webhook.pk))
    url = check_url(url)
    kinds = check_kinds(kinds)
    name = check_name(name)
    new_secret = check_secret(secret) if secret else None
    with transaction.atomic():
        hook = Webhook.objects.select_for_update().get(pk=webhook.pk)
        hook.url, hook.kinds, hook.active, hook.name = url, kinds, active, name
        if new_secret:
            hook.secret = new_secret
        hook.save()
        audit(
            actor,
            "webhook-update",
            "webhook",
            str(hook.pk),
            "updated",
            detail={
                "url": url,
                "kinds": kinds,
                "active": active,
                "name": name,
                "secretRotated": bool(new_secret),
            },
        )
    return hook


def do_delete_webhook(actor: Actor, webhook: Webhook) -> None:
    """Delete a webhook with its deliveries (the audit entry keeps what it was)."""
    require_admin(actor, "webhook-delete", str(webhook.pk))
    with transaction.atomic():
        detail = {"url": webhook.url, "kinds": webhook.kinds, "name": webhook.name}
        deleted, _ = Webhook.objects.filter(pk=webhook.pk).delete()
        audit(
            actor,
            "webhook-delete",
            "webhook",
            str(webhook.pk),
            "deleted" if deleted else "already-deleted",
            detail=detail,
        )


def do_send_test(actor: Actor, webhook: Webhook) -> WebhookDelivery:
    """Store a ``test`` delivery for this webhook (whatever its kinds and active flag); the
    upkeep loop sends it like any other, within a sweep interval."""
    require_admin(actor, "webhook-test", str(webhook.pk))
    with transaction.atomic():
        delivery = store_delivery(
            webhook,
            TEST_KIND,
            {"webhook": webhook.pk, "requestedBy": actor.label, "message": "test from Canopy"},
        )
        audit(
            actor,
            "webhook-test",
            "webhook",
            str(webhook.pk),
            "queued",
            detail={"deliveryId": delivery.delivery_id},
        )
    return delivery

"""Alerts (SPEC §10): webhooks configured by admins, and their deliveries.

A delivery is stored in the same transaction as the change that caused it (``enqueue_alert``),
before anything is sent; the upkeep loop (``delegation.webhooks``) claims due deliveries,
POSTs them and records each attempt here. Nothing on a request or ingest path does HTTP.

Every delivery is a JSON POST whose body is stored once and sent byte for byte on every retry::

    {"id": "<deliveryId>", "kind": "run-failed", "createdAt": "2026-11-30T13:00:00.000000+00:00",
     "data": {...}}

with the headers ``X-Canopy-Signature: sha256=<hex HMAC-SHA256 of the body with the
webhook's secret>``, ``X-Canopy-Delivery: <deliveryId>``, ``X-Canopy-Event: <kind>``, and
against replays ``X-Canopy-Timestamp: <unix seconds when this attempt was sent>`` with
``X-Canopy-Timestamp-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">``: a receiver
that checks it and refuses old timestamps cannot be fed a recorded delivery again.

Where a delivery may go (``check_url`` when a webhook is saved, ``refused_address`` for every
address the sender connects to): https to public addresses only, plain http to loopback only;
never a private, link-local, unspecified or cloud metadata address, whatever name points there.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from delegation import metrics, roles
from delegation.errors import INVALID_PARAMS, PermissionRefused, RpcError
from delegation.models import (
    ALERT_KINDS,
    DeliveryState,
    Run,
    Runner,
    Webhook,
    WebhookAttempt,
    WebhookDelivery,
)
from delegation.services.audit import audit
from delegation.services.embedded_ipv4 import embedded_ipv4s
from delegation.services.identity import Actor

TEST_KIND = "test"
SIGNATURE_HEADER = "X-Canopy-Signature"
TIMESTAMP_HEADER = "X-Canopy-Timestamp"
TIMESTAMP_SIGNATURE_HEADER = "X-Canopy-Timestamp-Signature"
# How old a timestamp ``verify_timestamped`` still accepts (a receiver's choice; this is ours).
TIMESTAMP_TOLERANCE_SECONDS = 300
MIN_SECRET_CHARS = 16


def sign(secret: str, body: bytes) -> str:
    """The ``X-Canopy-Signature`` value: ``sha256=`` and the hex HMAC-SHA256 of the body."""
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify(secret: str, body: bytes, header: str) -> bool:
    """What a receiver does (constant-time comparison of the whole header value)."""
    return hmac.compare_digest(sign(secret, body), header or "")


def sign_timestamped(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Canopy-Timestamp-Signature`` value: ``sha256=`` and the hex HMAC-SHA256 of
    ``<timestamp>.<body>``, so the signature holds only with the timestamp it was sent with."""
    return sign(secret, timestamp.encode("ascii") + b"." + body)


def verify_timestamped(
    secret: str,
    body: bytes,
    timestamp: str,
    header: str,
    *,
    now: float | None = None,
    tolerance: float = TIMESTAMP_TOLERANCE_SECONDS,
) -> bool:
    """What a receiver does against replays: the signature matches and the timestamp is recent."""
    try:
        sent = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs((time.time() if now is None else now) - sent) > tolerance:
        return False
    return hmac.compare_digest(sign_timestamped(secret, timestamp, body), header or "")


# --- Storing deliveries -------------------------------------------------------------------------


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
    return [_store_delivery(hook, kind, payload) for hook in hooks]


def _store_delivery(hook: Webhook, kind: str, payload: dict) -> WebhookDelivery:
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


# --- Admin actions: configure, delete, test -------------------------------------------------------


def require_admin(actor: Actor, action: str, target_id: str) -> None:
    if actor.user is not None and roles.can_admin(actor.user):
        return
    # Audited in its own transaction so the refusal survives the caller's rollback.
    with transaction.atomic():
        audit(actor, action, "webhook", target_id, "refused: not an admin")
    role = roles.role_of(actor.user) if actor.user is not None else None
    raise PermissionRefused(f"{actor.label} has role {role or 'none'}; {action} needs admin")


# Names of cloud instance metadata services (credentials live there); their addresses
# (169.254.169.254, fd00:ec2::254, 100.100.100.200) are refused as non-public anyway.
METADATA_NAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the system resolver; tests replace this function so
    that no name is looked up off the machine). Raises ``OSError`` when it does not resolve."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def refused_address(address: str, *, scheme: str) -> str | None:
    """Why a delivery may not go to ``address`` (an IP address as text), or None if it may:
    http goes to loopback only, https to public addresses only."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    if ip.version == 6:
        embedded = embedded_ipv4s(ip)
        for inner in embedded:
            reason = refused_address(str(inner), scheme=scheme)
            if reason is not None:
                return f"{ip} embeds {inner}: {reason}"
        if embedded:
            ip = embedded[0]
    if ip in METADATA_ADDRESSES:
        return f"{ip} is a cloud metadata address"
    if ip.is_loopback:
        if scheme == "http":
            return None
        return f"{ip} is loopback (for a receiver on this machine use http://127.0.0.1)"
    if scheme == "http":
        return f"{ip} is not loopback (http goes to this machine only)"
    if ip.is_unspecified:
        return f"{ip} is not a public address (it means this machine)"
    if ip.is_link_local:
        return f"{ip} is link-local"
    if ip.is_private:
        return f"{ip} is a private address"
    if not ip.is_global or ip.is_multicast:
        return f"{ip} is not a public address"
    return None


def check_target(scheme: str, host: str, port: int) -> None:
    """Refuse a host that is, or resolves to, an address a delivery may not go to.

    A name that does not resolve (yet) passes here: the sender resolves it again before
    every connection and refuses it then, so no lookup result is ever trusted for long.
    """
    if host.rstrip(".") in METADATA_NAMES:
        raise RpcError(INVALID_PARAMS, f"url: {host!r} is a cloud metadata service")
    try:
        ipaddress.ip_address(host)
        addresses = [host]
    except ValueError:
        try:
            addresses = resolve_host(host, port)
        except OSError:
            return
    for address in addresses:
        reason = refused_address(address, scheme=scheme)
        if reason is not None:
            shown = "" if address == host else f"{host!r} resolves to "
            raise RpcError(INVALID_PARAMS, f"url: {shown}{reason}")


def check_url(url: str) -> str:
    """HTTPS to a public address, or plain HTTP to this machine only (a secret must not cross
    a network in the clear); never an address inside the server's own networks."""
    if not isinstance(url, str) or not url.strip():
        raise RpcError(INVALID_PARAMS, "url: required")
    url = url.strip()
    if len(url) > 2048:
        raise RpcError(INVALID_PARAMS, "url: at most 2048 characters")
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"url: not a URL ({exc})") from None
    if not host:
        raise RpcError(INVALID_PARAMS, "url: has no host")
    if parts.username is not None or parts.password is not None:
        raise RpcError(INVALID_PARAMS, "url: must not carry credentials (use the secret)")
    if parts.scheme == "https":
        check_target("https", host, parts.port or 443)
        return url
    if parts.scheme == "http":
        if _loopback(host):
            check_target("http", host, parts.port or 80)
            return url
        raise RpcError(
            INVALID_PARAMS,
            f"url: http is allowed only to loopback (127.0.0.0/8, ::1, localhost), not {host!r}; "
            "use https",
        )
    raise RpcError(
        INVALID_PARAMS, f"url: scheme must be https (or http to loopback), not {parts.scheme!r}"
    )


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
        delivery = _store_delivery(
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


# --- The sender's bookkeeping (delegation.webhooks does the HTTP) ----------------------------------


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

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

The package by job: ``signing`` (the signatures), ``targets`` (where a delivery may go),
``config`` (the admins' actions on webhooks), ``deliveries`` (storing them, and the sender's
claims and attempts). The names below are what other modules use.
"""

from delegation.services.webhooks.config import (
    MIN_SECRET_CHARS,
    Created,
    check_kinds,
    check_name,
    check_secret,
    do_create_webhook,
    do_delete_webhook,
    do_send_test,
    do_update_webhook,
    require_admin,
)
from delegation.services.webhooks.deliveries import (
    TEST_KIND,
    Job,
    backoff_seconds,
    claim_due,
    enqueue_alert,
    record_attempt,
    run_finished,
    run_payload,
    runner_lost,
    store_delivery,
)
from delegation.services.webhooks.signing import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    TIMESTAMP_SIGNATURE_HEADER,
    TIMESTAMP_TOLERANCE_SECONDS,
    sign,
    sign_timestamped,
    verify,
    verify_timestamped,
)
from delegation.services.webhooks.targets import check_target, check_url, refused_address

__all__ = [
    "MIN_SECRET_CHARS",
    "Created",
    "check_kinds",
    "check_name",
    "check_secret",
    "do_create_webhook",
    "do_delete_webhook",
    "do_send_test",
    "do_update_webhook",
    "require_admin",
    "TEST_KIND",
    "Job",
    "backoff_seconds",
    "claim_due",
    "enqueue_alert",
    "record_attempt",
    "run_finished",
    "run_payload",
    "runner_lost",
    "store_delivery",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "TIMESTAMP_SIGNATURE_HEADER",
    "TIMESTAMP_TOLERANCE_SECONDS",
    "sign",
    "sign_timestamped",
    "verify",
    "verify_timestamped",
    "check_target",
    "check_url",
    "refused_address",
]

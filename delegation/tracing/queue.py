"""The durable export queue: ``TraceExport`` rows, written as runs end, claimed by the sender.

``run_ended`` runs inside the transaction that ends the run (``mark_finished``), so a run's
end and its queued export commit together or not at all. A row holds no spans, only the
promise: the sender builds them from the record when it sends, so the finish path pays one
small upsert.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from delegation.models import Run, TraceExport

_RESET = ("final", "sent", "queued_at", "next_attempt_at", "attempts", "last_error")


def run_ended(run: Run) -> None:
    """Queue (or queue again) the run's final spans; nothing unless export is on."""
    if not settings.OTEL_EXPORT_ENABLED:
        return
    now = timezone.now()
    TraceExport.objects.bulk_create(
        [TraceExport(run=run, final=True, queued_at=now, next_attempt_at=now)],
        update_conflicts=True,
        unique_fields=["run"],
        update_fields=list(_RESET),
    )


def queue_open_runs(now=None) -> int:
    """Queue the spans so far of runs open longer than OTEL_EXPORT_OPEN_AFTER_SECONDS that
    have no row yet (their end queues them again, complete)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.OTEL_EXPORT_OPEN_AFTER_SECONDS)
    pks = list(
        Run.objects.live()
        .filter(created_at__lte=cutoff, trace_export__isnull=True)
        .values_list("pk", flat=True)[:1000]
    )
    # Stamped with the wall clock: ``now`` only moves the cutoff (a sweep may pass its own).
    stamp = timezone.now()
    rows = [
        TraceExport(run_id=pk, final=False, queued_at=stamp, next_attempt_at=stamp) for pk in pks
    ]
    TraceExport.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def queue_tree(root: Run) -> int:
    """Queue every run of ``root``'s tree again (``export_traces --queue``)."""
    now = timezone.now()
    rows = [
        TraceExport(run_id=pk, final=is_done, queued_at=now, next_attempt_at=now)
        for pk, is_done in Run.objects.in_tree(root).values_list("pk", "done")
    ]
    TraceExport.objects.bulk_create(
        rows, update_conflicts=True, unique_fields=["run"], update_fields=list(_RESET)
    )
    return len(rows)


def claim(limit: int, now=None) -> tuple[list[int], object]:
    """Take up to ``limit`` due rows for this sender: their next attempt moves past the
    request's timeout, so another process's sender leaves them alone meanwhile. Answers
    the claimed runs' pks and the claim time (rows queued after it are newer spans)."""
    now = now or timezone.now()
    hold = now + timedelta(seconds=3 * settings.OTEL_EXPORT_TIMEOUT_SECONDS + 5)
    with transaction.atomic():
        due = TraceExport.objects.filter(sent=False, next_attempt_at__lte=now).order_by(
            "next_attempt_at", "pk"
        )
        if connection.features.has_select_for_update_skip_locked:
            due = due.select_for_update(skip_locked=True)
        rows = list(due.values_list("pk", "run_id")[:limit])
        if not rows:
            return [], now
        TraceExport.objects.filter(pk__in=[pk for pk, _ in rows]).update(next_attempt_at=hold)
    return [run_pk for _, run_pk in rows], now


def record_sent(run_pks: list[int], claimed_at) -> None:
    """Mark sent, unless queued again after the claim (then its newer spans are still due)."""
    TraceExport.objects.filter(run_id__in=run_pks, queued_at__lte=claimed_at).update(
        sent=True, sent_at=timezone.now(), attempts=F("attempts") + 1, last_error=""
    )


def record_failed(run_pks: list[int], claimed_at, error: str) -> float:
    """Back off exponentially (by the batch's attempts so far); answers the delay."""
    attempts = (
        TraceExport.objects.filter(run_id__in=run_pks)
        .order_by("-attempts")
        .values_list("attempts", flat=True)
        .first()
        or 0
    )
    delay = min(
        settings.OTEL_EXPORT_RETRY_MAX_SECONDS,
        settings.OTEL_EXPORT_RETRY_FIRST_SECONDS * 2 ** min(attempts, 30),
    )
    TraceExport.objects.filter(run_id__in=run_pks, queued_at__lte=claimed_at).update(
        attempts=F("attempts") + 1,
        last_error=error[:500],
        next_attempt_at=timezone.now() + timedelta(seconds=delay),
    )
    return delay

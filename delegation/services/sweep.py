"""Background upkeep: lease expiry, runner loss and budgets' time limits, safe to run in every process at once."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from delegation import notify
from delegation.models import Lease, LeaseState, Runner
from delegation.services import approval_endings, budgets, rollups
from delegation.services.identity import Actor
from delegation.services.locks import retry_conflicts
from delegation.services.run_actions import do_release_lease
from delegation.services.runners import lose_runner

log = logging.getLogger(__name__)


@dataclass
class SweepReport:
    expired_leases: list[str] = field(default_factory=list)
    lost_runners: list[str] = field(default_factory=list)
    budget_stops: list[int] = field(default_factory=list)
    expired_approvals: list[str] = field(default_factory=list)


def sweep(now=None) -> SweepReport:
    """Expire leases past their TTL and mark runners lost after the grace period.

    Safe to run in every process at once: each step re-checks its row under a lock.
    """
    now = now or timezone.now()
    report = SweepReport()
    for pk in Lease.objects.filter(state=LeaseState.ACTIVE, expires_at__lte=now).values_list(
        "pk", flat=True
    ):
        expired = _expire_lease(pk, now)
        if expired:
            report.expired_leases.append(expired)
    _disconnect_silent_runners()
    grace = timedelta(seconds=settings.RUNNER_GRACE_SECONDS)
    for pk in Runner.objects.filter(
        connected=False, lost_at__isnull=True, disconnected_at__lte=now - grace
    ).values_list("pk", flat=True):
        lost = _lose_runner(pk, now)
        if lost:
            report.lost_runners.append(lost)
    report.budget_stops = budgets.sweep_budgets(now)
    report.expired_approvals = approval_endings.expire_due()
    return report


@retry_conflicts
def _expire_lease(pk: int, now) -> str:
    """The lease's id once it is expired here; "" when another process or a release won."""
    with transaction.atomic():
        lease = Lease.objects.select_for_update().filter(pk=pk).first()
        if lease is None or lease.state != LeaseState.ACTIVE or lease.expires_at > now:
            return ""
        do_release_lease(Actor.system("system:lease-expiry"), lease, state=LeaseState.EXPIRED)
        return lease.lease_id


@retry_conflicts
def _lose_runner(pk: int, now) -> str:
    with transaction.atomic(), rollups.batch():
        runner = Runner.objects.select_for_update(no_key=True).filter(pk=pk).first()
        if runner is None or runner.connected or runner.lost_at is not None:
            return ""
        lose_runner(runner, now)
        return runner.name


def _disconnect_silent_runners() -> None:
    """A connection whose server process died never reports its close: every live runner
    socket touches ``last_seen_at`` each OUTBOX_RESEND_SECONDS, so one silent for
    RUNNER_SILENT_SECONDS is treated as closed, and its grace period counts from when it was
    last seen (``disconnected_at = last_seen_at``), not from this sweep.

    Wall-clock time, not the sweep's ``now``: this is about processes, not about leases.
    """
    silent_since = timezone.now() - timedelta(seconds=settings.RUNNER_SILENT_SECONDS)
    stale = Runner.objects.filter(connected=True, last_seen_at__lt=silent_since)
    for runner in stale.only("pk", "last_seen_at"):
        updated = Runner.objects.filter(
            pk=runner.pk, connected=True, last_seen_at=runner.last_seen_at
        ).update(connected=False, disconnected_at=runner.last_seen_at, channel_name="")
        if updated:
            log.warning(
                "runner %s silent since %s: treated as disconnected", runner.pk, runner.last_seen_at
            )
            notify.runner_changed(runner.pk)

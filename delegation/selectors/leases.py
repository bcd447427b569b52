"""Reads of leases."""

from __future__ import annotations

from django.db.models import Count, F, Q
from django.utils import timezone

from delegation.models import Lease, LeaseState, Run


def leases_matching(
    *, runner=None, lease_id=None, state=None, parent_run=None, live=None, now=None
):
    leases = Lease.objects.all()
    if runner is not None:
        leases = leases.filter(runner__name=runner)
    if lease_id is not None:
        leases = leases.filter(lease_id=lease_id)
    if state is not None:
        leases = leases.filter(state=state)
    if parent_run is not None:
        leases = leases.filter(parent_run__run_id=parent_run)
    if live is not None:
        alive = Q(state=LeaseState.ACTIVE, expires_at__gt=now or timezone.now())
        leases = leases.filter(alive) if live else leases.exclude(alive)
    return leases.annotate(
        childCount=Count("children"),
        liveChildCount=Count("children", filter=Q(children__status__in=("running", "paused"))),
    ).values(
        "pk",
        "state",
        "generation",
        "childCount",
        "liveChildCount",
        leaseId=F("lease_id"),
        runnerId=F("runner__name"),
        extensionId=F("extension_id"),
        parentRunId=F("parent_run__run_id"),
        parentTask=F("parent_run__task"),
        createdAt=F("created_at"),
        expiresAt=F("expires_at"),
        endedAt=F("ended_at"),
    )


def leases_held_by(run: Run) -> list[Lease]:
    return list(Lease.objects.filter(parent_run=run).select_related("runner"))


def get_lease(lease_pk: int) -> Lease | None:
    """A lease with its holder run and runner, for the release actions."""
    return Lease.objects.select_related("parent_run", "runner").filter(pk=lease_pk).first()

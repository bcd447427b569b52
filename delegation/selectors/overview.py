"""The overview's headline numbers (issue 25): is anything wrong right now?

One read for the trees page and ``GET /api/overview``, so the page and REST always agree.
Cost is attributed to the hour a run started in (its own cost, from its rollup row): the
rollups keep no timeline of their own, and a run's start is indexed.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Q, Sum
from django.utils import timezone

from delegation.models import Run, RunStatus
from delegation.selectors.approvals import pending_count

NANOS_PER_USD = 1_000_000_000
FAILED = (RunStatus.FAILED, RunStatus.LOST)
SERIES_HOURS = 24


def overview_numbers(now=None) -> dict:
    now = now or timezone.now()
    hour, day = now - timedelta(hours=1), now - timedelta(hours=SERIES_HOURS)
    by_status = {s.value: 0 for s in RunStatus}
    for status, count in Run.objects.values_list("status").annotate(n=Count("pk")).order_by():
        by_status[status] = count
    failed = Run.objects.filter(status__in=FAILED).aggregate(
        hour=Count("pk", filter=Q(finished_at__gte=hour)),
        day=Count("pk", filter=Q(finished_at__gte=day)),
    )
    series = [0] * SERIES_HOURS
    start = now - timedelta(hours=SERIES_HOURS)
    rows = (
        Run.objects.filter(created_at__gte=start)
        .values_list("created_at")
        .annotate(cost=Sum("rollup__own_cost_nanos"))
        .order_by()
    )
    cost_hour = 0
    for created_at, cost in rows:
        cost = cost or 0
        index = min(int((created_at - start).total_seconds() // 3600), SERIES_HOURS - 1)
        series[index] += cost
        if created_at >= hour:
            cost_hour += cost
    return {
        "liveRuns": by_status[RunStatus.RUNNING.value],
        "liveRoots": Run.objects.filter(root__isnull=True, status=RunStatus.RUNNING).count(),
        "failedLastHour": failed["hour"],
        "failedLastDay": failed["day"],
        # The same count as the navigation and GET /api/approvals?status=pending (SPEC §11).
        "pendingApprovals": pending_count(),
        "costLastHourUsd": cost_hour / NANOS_PER_USD,
        "costLastDayUsd": sum(series) / NANOS_PER_USD,
        "runsByStatus": by_status,
        "costByHour": [
            {"hourStart": start + timedelta(hours=i), "costUsd": nanos / NANOS_PER_USD}
            for i, nanos in enumerate(series)
        ],
        "at": now,
    }

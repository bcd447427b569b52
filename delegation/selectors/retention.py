"""What the retention pass (``delegation.services.retention``) would delete, and its record.

The pass and the admin page's preview read the same querysets, so the preview counts exactly
what the next pass deletes (as of now: more rows age past the limits while it waits).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from delegation.models import (
    TERMINAL_STATUSES,
    AuditEntry,
    Event,
    PurgedRun,
    RetentionPass,
    Run,
)

# Usage events stay with their run when its transcript goes: rollups and budgets are counted
# from them, so a recount over the record still equals the stored rollups.
KEPT_EVENT_KINDS = ("usage",)


@dataclass(frozen=True)
class Cutoffs:
    """Rows older than these go; None: that kind is kept forever (its setting is 0)."""

    events: datetime | None
    runs: datetime | None
    audit: datetime | None

    @property
    def any(self) -> bool:
        return any((self.events, self.runs, self.audit))


def cutoffs(now: datetime | None = None, event_days: int | None = None) -> Cutoffs:
    """The limits as of ``now``; ``event_days`` overrides EVENT_RETENTION_DAYS (purge_events)."""
    now = now or timezone.now()

    def before(days: int) -> datetime | None:
        return now - timedelta(days=days) if days > 0 else None

    return Cutoffs(
        events=before(settings.EVENT_RETENTION_DAYS if event_days is None else event_days),
        runs=before(settings.RUN_RETENTION_DAYS),
        audit=before(settings.AUDIT_RETENTION_DAYS),
    )


def _not_kept() -> Q:
    """Runs of trees nobody marked keep (the flag lives on the root)."""
    return ~Q(keep=True, root__isnull=True) & ~Q(root__keep=True)


def runs_to_strip(cutoff: datetime) -> QuerySet[Run]:
    """Finished runs whose transcript is due: finished before ``cutoff``, not stripped yet."""
    return Run.objects.filter(
        _not_kept(), finished_at__lt=cutoff, events_purged_at__isnull=True
    ).order_by("pk")


def strippable_events(run_pks) -> QuerySet[Event]:
    return Event.objects.filter(run_id__in=run_pks).exclude(kind__in=KEPT_EVENT_KINDS)


def trees_to_delete(cutoff: datetime) -> QuerySet[Run]:
    """Roots of whole trees that are due: the root finished before ``cutoff``, not kept, and no
    run of the tree still going or finished since (a tree goes whole or not at all, so the
    rollups of every run that stays are untouched)."""
    young_or_live = Run.objects.filter(root_id=OuterRef("pk")).filter(
        ~Q(status__in=TERMINAL_STATUSES) | Q(finished_at__isnull=True) | Q(finished_at__gte=cutoff)
    )
    return (
        Run.objects.filter(root__isnull=True, keep=False, finished_at__lt=cutoff)
        .exclude(Exists(young_or_live))
        .order_by("pk")
    )


def audit_to_delete(cutoff: datetime) -> QuerySet[AuditEntry]:
    return AuditEntry.objects.filter(created_at__lt=cutoff).order_by("pk")


def _buckets(limit_days: int) -> list[tuple[str, int, int | None]]:
    """Age bands past a limit of ``limit_days``: the first week past it, the rest of its first
    month, up to twice the limit, and beyond."""
    edges = sorted({limit_days, limit_days + 7, limit_days + 30, 2 * limit_days})
    bands = [(f"{a}–{b} days", a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a]
    return [*bands, (f"over {edges[-1]} days", edges[-1], None)]


def preview(now: datetime | None = None) -> list[dict]:
    """Per kind: its limit and how many rows the next pass deletes, by age band."""
    now = now or timezone.now()
    cut = cutoffs(now)
    kinds = [
        ("events", settings.EVENT_RETENTION_DAYS, cut.events, "run__finished_at"),
        ("runs", settings.RUN_RETENTION_DAYS, cut.runs, "finished_at"),
        ("audit entries", settings.AUDIT_RETENTION_DAYS, cut.audit, "created_at"),
    ]
    report = []
    for label, days, cutoff, field in kinds:
        if cutoff is None:
            report.append({"kind": label, "days": 0, "bands": [], "total": 0})
            continue
        if label == "events":
            rows = strippable_events(runs_to_strip(cutoff).values("pk"))
        elif label == "runs":
            roots = trees_to_delete(cutoff).values("pk")
            rows = Run.objects.filter(Q(pk__in=roots) | Q(root_id__in=roots))
            field = "root__finished_at"
        else:
            rows = audit_to_delete(cutoff)
        bands = []
        for name, low, high in _buckets(days):
            band = {f"{field}__lt": now - timedelta(days=low)}
            if high is not None:
                band[f"{field}__gte"] = now - timedelta(days=high)
            if label == "runs":
                # A root has no root: its own finished_at dates its tree.
                older = Q(**band) | Q(
                    root__isnull=True, **{k.replace("root__", ""): v for k, v in band.items()}
                )
                count = rows.filter(older).count()
            else:
                count = rows.filter(**band).count()
            bands.append({"label": name, "count": count})
        report.append(
            {"kind": label, "days": days, "bands": bands, "total": sum(b["count"] for b in bands)}
        )
    return report


def last_passes(limit: int = 10) -> list[RetentionPass]:
    return list(RetentionPass.objects.all()[:limit])


def purged_run(run_id: str):
    return PurgedRun.objects.filter(run_id=run_id).first()


def kept_trees(limit: int = 200) -> list[Run]:
    return list(Run.objects.filter(root__isnull=True, keep=True).order_by("-created_at")[:limit])

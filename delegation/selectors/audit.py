"""Reads of the audit log: the one set of filters, and a run's cancel report."""

from __future__ import annotations

from django.db.models import F

from delegation.models import AuditEntry, Run
from delegation.selectors.events import millis


def audit_entries(
    *,
    action=None,
    actor=None,
    via=None,
    target_type=None,
    target_id=None,
    outcome=None,
    user=None,
    created_after=None,
    created_before=None,
):
    """Audit entries matching the filters (combined with AND), newest first.

    ``actor`` and ``outcome`` match a case-insensitive substring: an actor is a label such as
    ``user:olga`` and a refusal's outcome carries its message (``refused: ...``). Everything
    else is exact, ``target_id`` included, so a run's entries never bring in another run's
    whose id happens to contain it.
    """
    entries = AuditEntry.objects.all()
    if action:
        entries = entries.filter(action=action)
    if actor:
        entries = entries.filter(actor__icontains=actor)
    if via:
        entries = entries.filter(via=via)
    if target_type:
        entries = entries.filter(target_type=target_type)
    if target_id:
        entries = entries.filter(target_id=target_id)
    if outcome:
        entries = entries.filter(outcome__icontains=outcome)
    if user:
        entries = entries.filter(user__username=user)
    if created_after is not None:
        entries = entries.filter(created_at__gte=created_after)
    if created_before is not None:
        entries = entries.filter(created_at__lt=created_before)
    return entries.order_by("-created_at", "-id")


def audit_rows(entries):
    return entries.values(
        "pk",
        "actor",
        "via",
        "action",
        "reason",
        "outcome",
        "detail",
        username=F("user__username"),
        targetType=F("target_type"),
        targetId=F("target_id"),
        createdAt=F("created_at"),
    )


def audit_actions():
    return AuditEntry.objects.values_list("action", flat=True).distinct().order_by("action")


def cancel_report(run: Run) -> tuple[AuditEntry | None, list[dict]]:
    """The latest accepted cancel of ``run`` and, per run it asked to stop, what was asked
    and where that run is now."""
    report = (
        AuditEntry.objects.filter(
            target_type="run", target_id=run.run_id, action__in=("cancel", "cancel-subtree")
        )
        .exclude(outcome__startswith="refused")
        .first()
    )
    if report is None:
        return None, []
    detail = report.detail or {}
    requested = [(detail.get("runId", run.run_id), run.depth, detail.get("outcome", ""))] + [
        (d["runId"], d.get("depth", 0), d.get("outcome", "")) for d in detail.get("descendants", [])
    ]
    current = {
        r.run_id: r
        for r in Run.objects.filter(run_id__in=[target for target, _d, _o in requested]).only(
            "run_id", "status", "finished_at", "depth"
        )
    }
    rows = []
    for target, depth, outcome in requested:
        found = current.get(target)
        rows.append(
            {
                "run_id": target,
                "depth": depth,
                "outcome": outcome,
                "status": found.status if found else "",
                "finished_ms": millis(found.finished_at) if found else None,
            }
        )
    return report, rows

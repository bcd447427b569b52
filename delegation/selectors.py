"""Reads: snapshots, event pages and trees, shaped as the wire shows them (SPEC §6 Result)."""

from __future__ import annotations

from django.db.models import Count, Q

from delegation.models import TERMINAL_STATUSES, Event, Run

RESULT_RELATED = ("session", "session__parent", "runner", "parent")

EVENT_FIELDS = (
    ("text", "text"),
    ("toolName", "tool_name"),
    ("toolCallId", "tool_call_id"),
    ("input", "input"),
    ("toolOutput", "tool_output"),
    ("success", "success"),
    ("error", "error"),
)


def event_wire(event: Event) -> dict:
    """An event as every reader sees it: sequence, kind, and the fields that are present."""
    wire = {"sequence": event.sequence, "kind": event.kind}
    for alias, attr in EVENT_FIELDS:
        value = getattr(event, attr)
        if value is not None:
            wire[alias] = value
    return wire


def events_after(run: Run, after: int = 0, limit: int | None = None, kinds=None):
    events = Event.objects.filter(run=run, sequence__gt=after).order_by("sequence")
    if kinds:
        events = events.filter(kind__in=kinds)
    if limit is not None:
        events = events[:limit]
    return list(events)


def snapshot(run: Run, events=()) -> dict:
    """The ``Result`` of SPEC §6: every field always present."""
    session = run.session
    parent_session = session.parent
    return {
        "runnerId": run.runner.name,
        "hostInstanceId": run.host_instance_id,
        "conversationId": session.conversation_id,
        "runId": run.run_id,
        "parentConversationId": parent_session.conversation_id if parent_session else "",
        "parentRunId": run.parent.run_id if run.parent_id else "",
        "extensionId": run.extension_id,
        "profile": run.profile,
        "done": run.done,
        "cancelled": run.cancelled,
        "error": run.error,
        "output": run.output,
        "events": [event_wire(event) for event in events],
        "depth": run.depth,
        "status": run.status,
    }


def get_run(run_id: str) -> Run | None:
    return Run.objects.select_related(*RESULT_RELATED).filter(run_id=run_id).first()


def subtree_runs(run: Run) -> list[Run]:
    """``run`` and every descendant, in one query through the denormalised root."""
    root_pk = run.root_id or run.pk
    if run.root_id is None:
        candidates = Run.objects.filter(Q(pk=root_pk) | Q(root_id=root_pk))
    else:
        candidates = Run.objects.filter(root_id=root_pk, depth__gte=run.depth)
    candidates = list(candidates.select_related("session", "runner").order_by("depth", "id"))
    if run.root_id is None:
        return candidates
    # Keep only the branch under ``run``: parents precede children in depth order.
    keep = {run.pk}
    branch = []
    for candidate in candidates:
        if candidate.pk == run.pk or candidate.parent_id in keep:
            keep.add(candidate.pk)
            branch.append(candidate)
    return branch


def live_descendants(run: Run) -> list[Run]:
    """Non-terminal runs below ``run`` (for cancel-subtree and its confirmation count)."""
    return [r for r in subtree_runs(run) if r.pk != run.pk and r.status not in TERMINAL_STATUSES]


def child_counts(run: Run) -> dict[str, int]:
    rows = Run.objects.filter(parent=run).values("status").annotate(n=Count("id"))
    return {row["status"]: row["n"] for row in rows}


# --- Dashboard reads (trees, summaries) -----------------------------------------------------

TREE_ROW_FIELDS = (
    "pk",
    "run_id",
    "parent_id",
    "root_id",
    "depth",
    "status",
    "profile",
    "runner__name",
    "created_at",
    "finished_at",
    "last_sequence",
    "refused_spawns",
    "cancel_requested_at",
    "lease_id",
)


def _millis(value) -> int | None:
    return int(value.timestamp() * 1000) if value is not None else None


def tree_rows(top: Run, only_pks=None) -> list[dict]:
    """Compact rows for ``top``'s subtree (the whole tree when ``top`` is a root).

    Each row carries what a tree line shows: depth, status, profile, runner, times, event
    count (the head sequence: events are numbered without gaps), refused spawns, whether a
    cancel was requested, and the active lease the run holds (with its expiry). With
    ``only_pks`` just those runs are read (a doorbell names the run that changed); the caller
    decides whether they belong to the subtree. Rows come parents first (depth, then id).
    """
    from delegation.models import Lease, LeaseState

    root_pk = top.root_id or top.pk
    runs = Run.objects.filter(Q(pk=root_pk) | Q(root_id=root_pk))
    if only_pks is not None:
        runs = runs.filter(pk__in=list(only_pks))
    elif top.root_id is not None:
        runs = runs.filter(depth__gte=top.depth)
    values = list(runs.order_by("depth", "id").values(*TREE_ROW_FIELDS))
    if only_pks is None and top.root_id is not None:
        keep = {top.pk}
        branch = []
        for row in values:
            if row["pk"] == top.pk or row["parent_id"] in keep:
                keep.add(row["pk"])
                branch.append(row)
        values = branch
    parent_pks = {row["parent_id"] for row in values if row["parent_id"]}
    known = {row["pk"]: row["run_id"] for row in values}
    missing = parent_pks - known.keys()
    if missing:
        known.update(Run.objects.filter(pk__in=missing).values_list("pk", "run_id"))
    leases = {}
    lease_rows = Lease.objects.filter(
        Q(parent_run_id=root_pk) | Q(parent_run__root_id=root_pk), state=LeaseState.ACTIVE
    ).values("parent_run_id", "lease_id", "expires_at")
    for lease in lease_rows:
        leases.setdefault(lease["parent_run_id"], []).append(
            {"leaseId": lease["lease_id"], "expiresAt": _millis(lease["expires_at"])}
        )
    return [
        {
            "pk": row["pk"],
            "runId": row["run_id"],
            "parentRunId": known.get(row["parent_id"], "") if row["parent_id"] else "",
            "parentPk": row["parent_id"],
            "depth": row["depth"],
            "status": row["status"],
            "profile": row["profile"],
            "runner": row["runner__name"],
            "createdAt": _millis(row["created_at"]),
            "finishedAt": _millis(row["finished_at"]),
            "events": row["last_sequence"],
            "refusedSpawns": row["refused_spawns"],
            "cancelRequested": row["cancel_requested_at"] is not None,
            "underLease": row["lease_id"] is not None,
            "leases": leases.get(row["pk"], []),
        }
        for row in values
    ]


def tree_summaries(root_pks) -> dict[int, dict]:
    """Per root: run counts by status, the deepest depth and the total, in one query."""
    from django.db.models import Max
    from django.db.models.functions import Coalesce

    root_pks = list(root_pks)
    summaries = {pk: {"counts": {}, "maxDepth": 0, "runs": 0} for pk in root_pks}
    if not root_pks:
        return summaries
    rows = (
        Run.objects.filter(Q(pk__in=root_pks) | Q(root_id__in=root_pks))
        .annotate(tree=Coalesce("root_id", "id"))
        .values("tree", "status")
        .annotate(n=Count("id"), deepest=Max("depth"))
    )
    for row in rows:
        summary = summaries[row["tree"]]
        summary["counts"][row["status"]] = row["n"]
        summary["runs"] += row["n"]
        summary["maxDepth"] = max(summary["maxDepth"], row["deepest"])
    return summaries

"""Reads: snapshots, event pages and trees, shaped as the wire shows them (SPEC §6 Result)."""

from __future__ import annotations

from django.db.models import Count, Exists, F, Max, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from delegation.models import (
    TERMINAL_STATUSES,
    AuditEntry,
    Event,
    ExtensionPreset,
    Lease,
    LeaseState,
    Run,
    Runner,
    Session,
    SteerReceipt,
)

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


def live_event_row(sequence: int, row: dict, created_ms: int, actor: str = "", data=None) -> dict:
    """The live socket's shape of an event (SPEC fields plus who and when), from stored values."""
    wire = {"sequence": sequence, "kind": row["kind"]}
    for alias, attr in EVENT_FIELDS:
        value = row[attr]
        if value is not None:
            wire[alias] = value
    wire["truncated"] = row["truncated"]
    wire["actor"] = actor
    if data is not None:
        wire["data"] = data
    wire["createdAt"] = created_ms
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


# --- REST API reads (issue 5) ---------------------------------------------------------------
# Every list is built as ONE query (joins and annotations, never a query per row) so a page
# costs the same whatever the number of runs; callers page them by primary key (keyset).


def _run_row_fields():

    return {
        "runId": F("run_id"),
        "conversationId": F("session__conversation_id"),
        "runnerId": F("runner__name"),
        "hostInstanceId": F("host_instance_id"),
        "extensionId": F("extension_id"),
        "leaseId": F("lease__lease_id"),
        "lastSequence": F("last_sequence"),
        "refusedSpawns": F("refused_spawns"),
        "cancelRequestedAt": F("cancel_requested_at"),
        "createdAt": F("created_at"),
        "updatedAt": F("updated_at"),
        "finishedAt": F("finished_at"),
    }


_RUN_ROW_COLUMNS = ("pk", "depth", "status", "done", "cancelled", "profile", "error", "parent_id")


def rest_tree_rows(runs):
    """Run rows for a subtree: only the joins a node cannot borrow from its parent.

    parentRunId, parentConversationId and rootRunId are filled in from the rows themselves
    by the caller, which saves three self-joins on a 10,000-run tree.
    """
    return runs.values(*_RUN_ROW_COLUMNS, **_run_row_fields())


def rest_run_rows(runs):
    """Compact run rows for REST lists, joined in the same query."""

    return runs.values(
        *_RUN_ROW_COLUMNS,
        "root_id",
        parentConversationId=F("session__parent__conversation_id"),
        parentRunId=F("parent__run_id"),
        rootRunId=F("root__run_id"),
        **_run_row_fields(),
    )


def rest_runs(
    *,
    statuses=None,
    depth=None,
    depth_min=None,
    depth_max=None,
    runner=None,
    profile=None,
    root=None,
    parent=None,
    conversation=None,
    created_after=None,
    created_before=None,
    q=None,
):
    """Runs matching the REST filters (all optional, combined with AND), as a queryset."""

    runs = Run.objects.all()
    if statuses:
        runs = runs.filter(status__in=list(statuses))
    if depth is not None:
        runs = runs.filter(depth=depth)
    if depth_min is not None:
        runs = runs.filter(depth__gte=depth_min)
    if depth_max is not None:
        runs = runs.filter(depth__lte=depth_max)
    if runner is not None:
        runs = runs.filter(runner__name=runner)
    if profile is not None:
        runs = runs.filter(profile=profile)
    if root is not None:
        # The whole tree of a top-level run: the run itself and every run below it. The root's
        # pk comes from a scalar subquery so both arms of the OR are index lookups.
        root_pk = Run.objects.filter(run_id=root, root__isnull=True).values("pk")[:1]
        runs = runs.filter(Q(root_id=Subquery(root_pk)) | Q(run_id=root, root__isnull=True))
    if parent is not None:
        runs = runs.filter(parent__run_id=parent)
    if conversation is not None:
        runs = runs.filter(session__conversation_id=conversation)
    if created_after is not None:
        runs = runs.filter(created_at__gte=created_after)
    if created_before is not None:
        runs = runs.filter(created_at__lt=created_before)
    if q:
        runs = runs.filter(Exists(Event.objects.filter(run_id=OuterRef("pk"), text__icontains=q)))
    return runs


def rest_subtree(run: Run, levels: int | None = None) -> tuple[list[dict], dict]:
    """``run``'s subtree down to ``levels`` below it, and child counts of every node.

    Two queries whatever the size of the tree: the rows through the denormalised root (the
    (root, depth) index), and one aggregation of children by (parent, status), which also
    counts the children of nodes on the depth boundary that are not returned.
    """
    root_pk = run.root_id or run.pk
    in_tree = Q(pk=root_pk) | Q(root_id=root_pk)
    rows_qs = Run.objects.filter(in_tree, depth__gte=run.depth)
    counts_qs = Run.objects.filter(root_id=root_pk, depth__gt=run.depth)
    if levels is not None:
        rows_qs = rows_qs.filter(depth__lte=run.depth + levels)
        counts_qs = counts_qs.filter(depth__lte=run.depth + levels + 1)
    rows = list(rest_tree_rows(rows_qs.order_by("depth", "id")))
    keep = {run.pk}
    branch = []
    for row in rows:
        if row["pk"] == run.pk or row["parent_id"] in keep:
            keep.add(row["pk"])
            branch.append(row)
    counts: dict[int, dict[str, int]] = {}
    for row in counts_qs.values("parent_id", "status").annotate(n=Count("id")).order_by():
        if row["parent_id"] in keep:
            counts.setdefault(row["parent_id"], {})[row["status"]] = row["n"]
    return branch, counts


def rest_subtree_ids(run: Run) -> dict[int, str]:
    """``{pk: runId}`` of ``run`` and every run below it (one query, no event rows)."""
    root_pk = run.root_id or run.pk
    rows = (
        Run.objects.filter(Q(pk=root_pk) | Q(root_id=root_pk), depth__gte=run.depth)
        .order_by("depth", "id")
        .values_list("pk", "parent_id", "run_id")
    )
    keep: dict[int, str] = {}
    for pk, parent_pk, run_id in rows:
        if pk == run.pk or parent_pk in keep:
            keep[pk] = run_id
    return keep


EXPORT_EVENT_COLUMNS = ("run_id", "sequence", "kind", *(attr for _alias, attr in EVENT_FIELDS))


def rest_event_page(run_pks, after: tuple[int, int], size: int) -> list[tuple]:
    """The next ``size`` events of ``run_pks`` after (run pk, sequence), as tuples.

    Keyset order on the (run, sequence) unique index, so each page is one index range scan and
    an export holds one page in memory at a time, however long the streams are.
    """
    run_pk, sequence = after
    events = Event.objects.filter(run_id__in=list(run_pks)).filter(
        Q(run_id__gt=run_pk) | Q(run_id=run_pk, sequence__gt=sequence)
    )
    return list(events.order_by("run_id", "sequence").values_list(*EXPORT_EVENT_COLUMNS)[:size])


def rest_sessions(
    *, runner=None, depth=None, parent=None, profile=None, created_after=None, created_before=None
):

    sessions = Session.objects.all()
    if runner is not None:
        sessions = sessions.filter(runner__name=runner)
    if depth is not None:
        sessions = sessions.filter(depth=depth)
    if parent is not None:
        sessions = sessions.filter(parent__conversation_id=parent)
    if profile is not None:
        sessions = sessions.filter(profile=profile)
    if created_after is not None:
        sessions = sessions.filter(created_at__gte=created_after)
    if created_before is not None:
        sessions = sessions.filter(created_at__lt=created_before)
    return sessions.values(
        "pk",
        "depth",
        "profile",
        conversationId=F("conversation_id"),
        runnerId=F("runner__name"),
        parentConversationId=F("parent__conversation_id"),
        extensionId=F("extension_id"),
        hostInstanceId=F("host_instance_id"),
        createdAt=F("created_at"),
    )


def rest_leases(*, runner=None, lease_id=None, state=None, parent_run=None, live=None, now=None):

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
        liveChildCount=Count("children", filter=Q(children__status="running")),
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
        createdAt=F("created_at"),
        expiresAt=F("expires_at"),
        endedAt=F("ended_at"),
    )


def rest_runners(*, connected=None, name=None):

    runners = Runner.objects.all()
    if connected is not None:
        runners = runners.filter(connected=connected)
    if name is not None:
        runners = runners.filter(name=name)
    return runners.values(
        "pk",
        "connected",
        "workspace",
        runnerId=F("name"),
        connectionGeneration=F("connection_generation"),
        hostInstanceId=F("host_instance_id"),
        declaredDepth=F("declared_depth"),
        createdAt=F("created_at"),
        revokedAt=F("revoked_at"),
        lastSeenAt=F("last_seen_at"),
        disconnectedAt=F("disconnected_at"),
        lostAt=F("lost_at"),
    )


def rest_runner_counts(runner_pk: int) -> dict[str, int]:
    rows = Run.objects.filter(runner_id=runner_pk).values("status").annotate(n=Count("id"))
    return {row["status"]: row["n"] for row in rows.order_by()}


def rest_audit(
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

    entries = AuditEntry.objects.all()
    if action is not None:
        entries = entries.filter(action=action)
    if actor is not None:
        entries = entries.filter(actor=actor)
    if via is not None:
        entries = entries.filter(via=via)
    if target_type is not None:
        entries = entries.filter(target_type=target_type)
    if target_id is not None:
        entries = entries.filter(target_id=target_id)
    if outcome is not None:
        entries = entries.filter(outcome=outcome)
    if user is not None:
        entries = entries.filter(user__username=user)
    if created_after is not None:
        entries = entries.filter(created_at__gte=created_after)
    if created_before is not None:
        entries = entries.filter(created_at__lt=created_before)
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


def rest_run(run_id: str) -> Run | None:
    """One run with everything its REST detail shows, in one query."""
    return (
        Run.objects.select_related(*RESULT_RELATED, "root", "lease", "lease__runner")
        .filter(run_id=run_id)
        .first()
    )


def rest_session_runs(session_pk: int):
    return rest_run_rows(Run.objects.filter(session_id=session_pk).order_by("created_at", "id"))


def rest_presets(runner_pk: int) -> list:

    return list(
        ExtensionPreset.objects.filter(runner_id=runner_pk).order_by("extension_id", "name")
    )


def steer_receipts(run: Run) -> list:
    """Every steer of one run, oldest first, with how each one turned out."""
    return list(SteerReceipt.objects.filter(run=run).order_by("created_at", "id"))

"""Reads of delegation trees: subtrees, tree rows for the live view, summaries, the overview."""

from __future__ import annotations

from django.db.models import Count, F, Max, Q
from django.db.models.functions import Coalesce

from delegation.models import TERMINAL_STATUSES, Lease, LeaseState, Run, RunRollup, RunStatus
from delegation.selectors.approvals import pending_in_tree
from delegation.selectors.events import millis
from delegation.selectors.runs import (
    subtree_row_values,
    text_matches,
)

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
    "via",
    "cancel_requested_at",
    "lease_id",
    "task",
    "activity",
    # Issue 24: a tree row's conclusion mark (the status alone).
    "conclusion__status",
)


def tree_root_pk(run: Run) -> int:
    return run.root_id or run.pk


def _branch(rows, top_pk: int, pk=lambda row: row["pk"], parent=lambda row: row["parent_id"]):
    """Only the rows under ``top_pk`` (inclusive): in depth order parents precede children."""
    keep = {top_pk}
    branch = []
    for row in rows:
        if pk(row) == top_pk or parent(row) in keep:
            keep.add(pk(row))
            branch.append(row)
    return branch, keep


def subtree_runs(run: Run) -> list[Run]:
    """``run`` and every descendant, in one query through the denormalised root."""
    if run.root_id is None:
        candidates = Run.objects.in_tree(run.pk)
    else:
        candidates = Run.objects.filter(root_id=run.root_id, depth__gte=run.depth)
    candidates = list(candidates.select_related("session", "runner").order_by("depth", "id"))
    if run.root_id is None:
        return candidates
    branch, _keep = _branch(candidates, run.pk, lambda r: r.pk, lambda r: r.parent_id)
    return branch


def live_descendants(run: Run) -> list[Run]:
    """Non-terminal runs below ``run`` (for cancel-subtree and its confirmation count)."""
    return [r for r in subtree_runs(run) if r.pk != run.pk and r.status not in TERMINAL_STATUSES]


def live_descendant_count(run: Run) -> int:
    """How many runs below ``run`` are not finished, without loading them: a root's whole
    tree is one indexed count; a branch reads three columns of the runs below its depth."""
    if run.root_id is None:
        return Run.objects.filter(root_id=run.pk).live().count()
    below = Run.objects.filter(root_id=run.root_id, depth__gt=run.depth).order_by("depth", "id")
    branch, _keep = _branch(
        below.values_list("pk", "parent_id", "status"),
        run.pk,
        lambda row: row[0],
        lambda row: row[1],
    )
    return sum(1 for row in branch if row[2] not in TERMINAL_STATUSES)


def tree_rows(top: Run, only_pks=None) -> list[dict]:
    """Compact rows for ``top``'s subtree (the whole tree when ``top`` is a root).

    Each row carries what a tree line shows: depth, status, profile, runner, times, event
    count (the head sequence: events are numbered without gaps), refused spawns, whether a
    cancel was requested, and the active lease the run holds (with its expiry). With
    ``only_pks`` just those runs are read (a doorbell names the run that changed); the caller
    decides whether they belong to the subtree. Rows come parents first (depth, then id).
    """

    root_pk = tree_root_pk(top)
    runs = Run.objects.in_tree(root_pk)
    if only_pks is not None:
        runs = runs.filter(pk__in=list(only_pks))
    elif top.root_id is not None:
        runs = runs.filter(depth__gte=top.depth)
    values = list(runs.order_by("depth", "id").values(*TREE_ROW_FIELDS, **TREE_USAGE_FIELDS))
    if only_pks is None and top.root_id is not None:
        values, _keep = _branch(values, top.pk)
    parent_pks = {row["parent_id"] for row in values if row["parent_id"]}
    known = {row["pk"]: row["run_id"] for row in values}
    missing = parent_pks - known.keys()
    if missing:
        known.update(Run.objects.filter(pk__in=missing).values_list("pk", "run_id"))
    leases = {}
    lease_rows = Lease.objects.filter(
        parent_run__in=Run.objects.in_tree(root_pk), state=LeaseState.ACTIVE
    ).values("parent_run_id", "lease_id", "expires_at")
    for lease in lease_rows:
        leases.setdefault(lease["parent_run_id"], []).append(
            {"leaseId": lease["lease_id"], "expiresAt": millis(lease["expires_at"])}
        )
    pending = pending_in_tree(root_pk)
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
            "createdAt": millis(row["created_at"]),
            "finishedAt": millis(row["finished_at"]),
            "events": row["last_sequence"],
            "refusedSpawns": row["refused_spawns"],
            "via": row["via"],
            "cancelRequested": row["cancel_requested_at"] is not None,
            "underLease": row["lease_id"] is not None,
            "leases": leases.get(row["pk"], []),
            **tree_usage(row),
            "task": row["task"],
            "activity": row["activity"],
            "conclusionStatus": row["conclusion__status"],
            **pending_fields(pending, row["pk"]),
        }
        for row in values
    ]


def pending_fields(pending: dict, pk: int) -> dict:
    own, sub = pending.get(pk, (0, 0))
    return {"pendingApprovals": own, "subPendingApprovals": sub}


# What a tree row shows of its rollup and budget: only figures that change when rows commit
# (no wall time), so an unchanged row is never resent; the page computes time itself.
TREE_USAGE_FIELDS = {
    "u_tokens_in": F("rollup__sub_tokens_in"),
    "u_tokens_out": F("rollup__sub_tokens_out"),
    "u_cost": F("rollup__sub_cost_nanos"),
    "u_own_cost": F("rollup__own_cost_nanos"),
    "u_running": F("rollup__sub_running"),
    "u_total": F("rollup__sub_running")
    + F("rollup__sub_succeeded")
    + F("rollup__sub_failed")
    + F("rollup__sub_cancelled")
    + F("rollup__sub_lost"),
    "b_pk": F("budget__run_id"),
    "b_runs": F("budget__max_runs"),
    "b_live": F("budget__max_live"),
    "b_tokens": F("budget__max_tokens"),
    "b_cost": F("budget__max_cost_nanos"),
    "b_seconds": F("budget__max_seconds"),
    "b_warned": F("budget__warned_at"),
    "b_exceeded": F("budget__exceeded_reason"),
}
_NANOS = 1_000_000_000


def tree_usage(row: dict) -> dict:
    usage = {
        "tokens": (row["u_tokens_in"] or 0) + (row["u_tokens_out"] or 0),
        "costUsd": (row["u_cost"] or 0) / _NANOS,
        "ownCostUsd": (row["u_own_cost"] or 0) / _NANOS,
        "live": row["u_running"] or 0,
        "runs": row["u_total"] or 0,
    }
    budget = None
    if row["b_pk"] is not None:
        limits = {
            name: value
            for name, value in (
                ("maxRuns", row["b_runs"]),
                ("maxLive", row["b_live"]),
                ("maxTokens", row["b_tokens"]),
                ("maxCostUsd", None if row["b_cost"] is None else row["b_cost"] / _NANOS),
                ("maxSeconds", row["b_seconds"]),
            )
            if value is not None
        }
        budget = {
            "limits": limits,
            "warned": row["b_warned"] is not None,
            "exceededReason": row["b_exceeded"] or "",
        }
    return {"usage": usage, "budget": budget}


def tree_rows_changed(top_pk: int, only_pks=None, since=None) -> list[dict]:
    """Rows of the subtree under ``top_pk``; with ``since``, only runs changed after it (plus
    ``only_pks``).

    A doorbell names one run, but a ring may be lost or coalesced with others of the same
    tree, so the changed set is read from ``updated_at`` (the caller leaves an overlap for
    transactions that committed late) and the live socket's heartbeat still diffs the whole
    tree.
    """
    top = Run.objects.filter(pk=top_pk).first()
    if top is None:
        return []
    if since is None:
        return tree_rows(top, only_pks)
    tree = Run.objects.in_tree(tree_root_pk(top))
    pks = set(only_pks or ())
    pks.update(tree.filter(updated_at__gte=since).values_list("pk", flat=True))
    # An ancestor's rollup moves when a descendant reports usage or changes status.
    pks.update(
        RunRollup.objects.filter(run__in=tree, updated_at__gte=since).values_list("pk", flat=True)
    )
    pks.update(
        Lease.objects.filter(parent_run__in=tree)
        .filter(Q(created_at__gte=since) | Q(ended_at__gte=since))
        .values_list("parent_run_id", flat=True)
    )
    # A request or decision moves the counts of the run and of every ancestor.
    pks.update(pending_in_tree(tree_root_pk(top), since=since))
    return tree_rows(top, pks)


def tree_summaries(root_pks) -> dict[int, dict]:
    """Per root: run counts by status, the deepest depth and the total, in one query."""

    root_pks = list(root_pks)
    summaries = {pk: {"counts": {}, "maxDepth": 0, "runs": 0} for pk in root_pks}
    if not root_pks:
        return summaries
    rows = (
        Run.objects.in_trees(root_pks)
        .annotate(tree=Coalesce("root_id", "id"))
        .values("tree", "status")
        .annotate(n=Count("id"), deepest=Max("depth"))
    )
    for row in rows:
        summary = summaries[row["tree"]]
        summary["counts"][row["status"]] = row["n"]
        summary["runs"] += row["n"]
        summary["maxDepth"] = max(summary["maxDepth"], row["deepest"])
    for summary in summaries.values():
        summary.update(tokens=0, costUsd=0.0, budgetStopped="")
    # The roots' rollups: the whole tree's usage, kept current as rows commit.
    for pk, tokens_in, tokens_out, cost, stopped in RunRollup.objects.filter(
        pk__in=root_pks
    ).values_list(
        "pk", "sub_tokens_in", "sub_tokens_out", "sub_cost_nanos", "run__budget__exceeded_reason"
    ):
        summaries[pk].update(
            tokens=tokens_in + tokens_out, costUsd=cost / _NANOS, budgetStopped=stopped or ""
        )
    return summaries


def root_summaries(root_pks) -> dict[int, dict]:
    """``tree_summaries`` plus the root's identity: a tree announced live has only its runId
    on the page."""
    summaries = tree_summaries(root_pks)
    roots = {
        pk: rest
        for pk, *rest in Run.objects.filter(pk__in=list(root_pks)).values_list(
            "pk", "status", "profile", "runner__name", "session__conversation_id", "task"
        )
    }
    for pk, summary in summaries.items():
        status, profile, runner, conversation, task = roots.get(pk, ("", "", "", "", ""))
        summary.update(
            status=status,
            profile=profile,
            runnerId=runner,
            conversationId=conversation,
            task=task,  # the tree's name (its root's task) on a row announced live
        )
    return summaries


def root_pks_by_run_id(run_ids) -> dict[int, str]:
    """``{pk: runId}`` of the top-level runs among ``run_ids``."""
    return dict(
        Run.objects.filter(run_id__in=list(run_ids), root__isnull=True).values_list("pk", "run_id")
    )


def run_id_of(run_pk: int) -> str | None:
    return Run.objects.filter(pk=run_pk).values_list("run_id", flat=True).first()


def trees_matching(
    *, status=None, active=False, runner=None, profile=None, created_after=None, q=None
):
    """Top-level runs, newest first, for the trees overview.

    ``status``, ``runner``, ``profile`` and ``created_after`` are about the root itself;
    ``active`` keeps trees with any run still running anywhere in them, and ``q`` keeps trees
    with any run matching the text (``runs.text_matches``: the same meaning as the REST
    ``q`` filter).
    """
    roots = Run.objects.filter(root__isnull=True).select_related("runner", "session")
    if status:
        roots = roots.filter(status=status)
    if active:
        busy = Run.objects.filter(status=RunStatus.RUNNING).annotate(tree=Coalesce("root_id", "id"))
        roots = roots.filter(pk__in=busy.values("tree"))
    if runner:
        roots = roots.filter(runner__name=runner)
    if profile:
        roots = roots.filter(profile=profile)
    if created_after is not None:
        roots = roots.filter(created_at__gte=created_after)
    if q:
        matching = Run.objects.filter(text_matches(q)).annotate(tree=Coalesce("root_id", "id"))
        roots = roots.filter(pk__in=matching.values("tree"))
    return roots.order_by("-created_at", "-id")


def subtree_with_counts(
    run: Run, levels: int | None = None, usage: bool = False
) -> tuple[list[dict], dict]:
    """``run``'s subtree down to ``levels`` below it, and child counts of every node.

    Two queries whatever the size of the tree: the rows through the denormalised root (the
    (root, depth) index), and one aggregation of children by (parent, status), which also
    counts the children of nodes on the depth boundary that are not returned.
    """
    root_pk = tree_root_pk(run)
    rows_qs = Run.objects.in_tree(root_pk).filter(depth__gte=run.depth)
    counts_qs = Run.objects.in_tree(root_pk).filter(depth__gt=run.depth)
    if levels is not None:
        rows_qs = rows_qs.filter(depth__lte=run.depth + levels)
        counts_qs = counts_qs.filter(depth__lte=run.depth + levels + 1)
    rows = list(subtree_row_values(rows_qs.order_by("depth", "id"), usage))
    branch, keep = _branch(rows, run.pk)
    counts: dict[int, dict[str, int]] = {}
    for row in counts_qs.values("parent_id", "status").annotate(n=Count("id")).order_by():
        if row["parent_id"] in keep:
            counts.setdefault(row["parent_id"], {})[row["status"]] = row["n"]
    return branch, counts


def subtree_run_ids(run: Run) -> dict[int, str]:
    """``{pk: runId}`` of ``run`` and every run below it (one query, no event rows)."""
    rows = (
        Run.objects.in_tree(tree_root_pk(run))
        .filter(depth__gte=run.depth)
        .order_by("depth", "id")
        .values_list("pk", "parent_id", "run_id")
    )
    keep: dict[int, str] = {}
    for pk, parent_pk, run_id in rows:
        if pk == run.pk or parent_pk in keep:
            keep[pk] = run_id
    return keep

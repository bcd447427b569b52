"""Trees read in chunks and batches: the live snapshot and the full diff never hold a 100k-run
tree (column chunks keyset-paged on (depth, pk), the subtree's skeleton, rows by pk)."""

from __future__ import annotations

from delegation.models import Lease, LeaseState, Run
from delegation.selectors.db_functions import EpochMillis, IsoMillis
from delegation.selectors.events import millis
from delegation.selectors.runs import (
    RUN_ROW_COLUMNS,
    run_row_fields,
)
from delegation.selectors.trees import (
    TREE_USAGE_FIELDS,
    pending_fields,
    tree_root_pk,
    tree_usage,
)
from delegation.selectors.usage import tree_usage_values

TREE_COLUMNS = (
    ("pk", "pk"),
    ("runId", "run_id"),
    ("parentPk", "parent_id"),
    ("depth", "depth"),
    ("status", "status"),
    ("profile", "profile"),
    ("runner", "runner__name"),
    ("createdAt", "created_ms"),
    ("finishedAt", "finished_ms"),
    ("events", "last_sequence"),
    ("refusedSpawns", "refused_spawns"),
    ("cancelRequested", "cancel_ms"),
    ("underLease", "lease_id"),
    ("task", "task"),
    ("activity", "activity"),
    ("via", "via"),
    ("conclusionStatus", "conclusion__status"),
)
_FLAGS = {"cancelRequested", "underLease"}
# Read beside TREE_COLUMNS and folded into two columns of objects, "usage" and "budget"
# (as every tree row carries them): rollups and budgets are joined rows, not run columns.
_USAGE_NAMES = tuple(TREE_USAGE_FIELDS)


_TIME_COLUMNS = {
    "created_ms": EpochMillis("created_at"),
    "finished_ms": EpochMillis("finished_at"),
    "cancel_ms": EpochMillis("cancel_requested_at"),
}


def tree_leases(root_pk: int) -> dict[int, list[dict]]:
    """Active leases held by runs of the tree, by the holder's pk (few, even in big trees)."""
    leases: dict[int, list[dict]] = {}
    rows = Lease.objects.filter(
        parent_run__in=Run.objects.in_tree(root_pk), state=LeaseState.ACTIVE
    ).values("parent_run_id", "lease_id", "expires_at")
    for lease in rows:
        leases.setdefault(lease["parent_run_id"], []).append(
            {"leaseId": lease["lease_id"], "expiresAt": millis(lease["expires_at"])}
        )
    return leases


def tree_chunk(top_pk: int, after=None, limit: int = 5000, keep=None):
    """One chunk of the subtree under ``top_pk`` as column arrays, parents before children.

    Keyset-paged on (depth, pk) through the (root, depth) index, so the whole snapshot is
    read a chunk at a time. ``after`` is the (depth, pk) of the last row read; ``keep`` the
    pks of the branch seen so far (only for a subtree below the root: rows of other branches
    are dropped). Returns ``(columns, last, keep)``; ``last`` is None when nothing is left.
    """
    top = Run.objects.filter(pk=top_pk).values("pk", "root_id", "depth").first()
    if top is None:
        return None, None, keep
    whole = top["root_id"] is None
    root_pk = top["root_id"] or top["pk"]
    if not whole and keep is None:
        keep = {top["pk"]}
    fields = [field for _name, field in TREE_COLUMNS] + list(_USAGE_NAMES)
    # Below the root every run has root_id set: ranges on the (root, depth) index, already in
    # (depth, pk) order there, so no chunk sorts the tree (an OR with the root's row did).
    below = Run.objects.filter(root_id=root_pk).annotate(**_TIME_COLUMNS, **TREE_USAGE_FIELDS)
    rows = []
    if after is None:
        if whole:
            rows = list(
                Run.objects.filter(pk=root_pk)
                .annotate(**_TIME_COLUMNS, **TREE_USAGE_FIELDS)
                .values_list(*fields)
            )
        depth, pk = (0, 0) if whole else (top["depth"], 0)
    else:
        depth, pk = after
    # One row past the chunk says whether another chunk follows, without an empty last one.
    want = limit + 1 - len(rows)
    rows += list(below.filter(depth=depth, pk__gt=pk).order_by("pk").values_list(*fields)[:want])
    want = limit + 1 - len(rows)
    if want > 0:
        rows += list(
            below.filter(depth__gt=depth).order_by("depth", "pk").values_list(*fields)[:want]
        )
    more = len(rows) > limit
    rows = rows[:limit]
    names = [name for name, _field in TREE_COLUMNS]
    columns = {name: [] for name in (*names, "usage", "budget")}
    width = len(names)
    for row in rows:
        if keep is not None:
            if row[0] != top["pk"] and row[2] not in keep:
                continue
            keep.add(row[0])
        for name, value in zip(names, row[:width], strict=True):
            if name in _FLAGS:
                value = value is not None
            columns[name].append(value)
        shown = tree_usage(dict(zip(_USAGE_NAMES, row[width:], strict=True)))
        columns["usage"].append(shown["usage"])
        columns["budget"].append(shown["budget"])
    last = (rows[-1][3], rows[-1][0]) if more else None
    return columns, last, keep


def column_rows(columns: dict, leases: dict, ids: dict, pending=None) -> list[dict]:
    """A chunk's columns as the row objects of ``tree_rows``; ``ids`` maps pk to runId and
    must already hold every parent (chunks come parents first)."""
    out = []
    names = list(columns)
    for values in zip(*(columns[name] for name in names), strict=True):
        row = dict(zip(names, values, strict=True))
        ids[row["pk"]] = row["runId"]
        parent = row["parentPk"]
        row["parentRunId"] = ids.get(parent, "") if parent else ""
        row["leases"] = leases.get(row["pk"], [])
        row.update(pending_fields(pending or {}, row["pk"]))
        out.append(row)
    return out


def subtree_skeleton(run: Run, levels: int | None = None):
    """The shape of ``run``'s subtree without its rows: children of every node (in creation
    order) down to ``levels`` below it, and child counts by status of every node (including
    nodes on the depth boundary). Two ints and a status per run, read a batch at a time in
    (depth, pk) order, which the (root, depth) index gives without sorting."""
    root_pk = tree_root_pk(run)
    below = Run.objects.filter(root_id=root_pk, depth__gt=run.depth)
    if levels is not None:
        below = below.filter(depth__lte=run.depth + levels + 1)
    boundary = None if levels is None else run.depth + levels
    children: dict[int, list[int]] = {}
    counts: dict[int, dict[str, int]] = {}
    keep = {run.pk}
    rows = below.order_by("depth", "pk").values_list("pk", "parent_id", "status", "depth")
    for pk, parent_pk, status, depth in rows.iterator(chunk_size=10_000):
        if parent_pk not in keep:
            continue
        by_status = counts.setdefault(parent_pk, {})
        by_status[status] = by_status.get(status, 0) + 1
        if boundary is None or depth <= boundary:
            keep.add(pk)
            children.setdefault(parent_pk, []).append(pk)
    return children, counts


def preorder(top_pk: int, children: dict[int, list[int]]):
    """``(pk, number of children)`` of every node, depth first, parents before children."""
    stack = [top_pk]
    while stack:
        pk = stack.pop()
        kids = children.get(pk, ())
        yield pk, len(kids)
        stack.extend(reversed(kids))


_ISO_TIMES = {
    "cancelRequestedAt": IsoMillis("cancel_requested_at"),
    "createdAt": IsoMillis("created_at"),
    "updatedAt": IsoMillis("updated_at"),
    "finishedAt": IsoMillis("finished_at"),
}


def subtree_rows_by_pk(pks, usage: bool = False) -> dict[int, dict]:
    """Full subtree rows (as ``subtree_with_counts``, times as ISO text) for a batch of pks;
    ``usage`` adds each node's rollup and budget columns (``pop_tree_usage`` shapes them)."""
    fields = {**run_row_fields(), **_ISO_TIMES, **(tree_usage_values() if usage else {})}
    rows = Run.objects.filter(pk__in=list(pks)).values(*RUN_ROW_COLUMNS, **fields)
    return {row["pk"]: row for row in rows}

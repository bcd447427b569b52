"""Rollups (SPEC §10): each run's own usage and its subtree's, kept current as rows commit.

Writers describe a change (a run created, a status change, a frame's usage) and this module
turns it into increments on the run's ancestor chain (``Run.ancestry`` plus the run), never
a scan of the tree. Inside ``batch()`` the increments are collected and applied when the
outermost batch ends, still inside the caller's transaction; outside a batch they are applied
at once. Either way they are applied last: rollup rows are locked after every run row the
transaction takes, and in ascending pk order (ancestors first), so two writers never wait
for each other in a cycle.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from contextlib import contextmanager
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.utils import timezone

from delegation.models import Run, RunRollup, RunStatus

NANOS_PER_USD = 1_000_000_000

STATUS_COLUMNS = {
    RunStatus.RUNNING: "sub_running",
    # A paused run is live (SPEC §14): it counts with the running ones, so a pause or a
    # resume changes no rollup and maxLive still holds its place.
    RunStatus.PAUSED: "sub_running",
    RunStatus.SUCCEEDED: "sub_succeeded",
    RunStatus.FAILED: "sub_failed",
    RunStatus.CANCELLED: "sub_cancelled",
    RunStatus.LOST: "sub_lost",
}
# Usage figure -> (own column, subtree column).
USAGE_COLUMNS = {
    "tokens_in": ("own_tokens_in", "sub_tokens_in"),
    "tokens_out": ("own_tokens_out", "sub_tokens_out"),
    "cache_read": ("own_cache_read", "sub_cache_read"),
    "cache_write": ("own_cache_write", "sub_cache_write"),
    "cost_nanos": ("own_cost_nanos", "sub_cost_nanos"),
    "unpriced": ("own_unpriced_usage", "sub_unpriced_usage"),
}


def enabled() -> bool:
    """Rollups are always on; ``ROLLUPS_ENABLED=false`` exists for the ingest benchmark only,
    which measures ingest with and without them in one run."""
    return getattr(settings, "ROLLUPS_ENABLED", True)


def chain_of(run: Run) -> list[int]:
    """The pks whose subtree contains ``run``: its ancestors, root first, then itself."""
    return [*run.ancestry, run.pk]


def cost_nanos(cost_usd: float) -> int:
    return round(cost_usd * NANOS_PER_USD)


class _Pending:
    def __init__(self):
        self.sub: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.own: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.last_end: dict[int, datetime] = {}
        self.budgeted: set[int] = set()

    def add_sub(self, pks, column: str, delta: int) -> None:
        for pk in pks:
            self.sub[pk][column] += delta

    def empty(self) -> bool:
        return not self.sub and not self.own and not self.last_end


_local = threading.local()


@contextmanager
def batch():
    """Collect rollup increments and apply them when the outermost batch ends.

    Enter it inside the transaction, around everything that locks runs:
    ``with transaction.atomic(), rollups.batch(): ...``.
    """
    outer = getattr(_local, "pending", None) is None
    if outer:
        _local.pending = _Pending()
    try:
        yield
        if outer:
            _apply(_local.pending)
    finally:
        if outer:
            _local.pending = None


@contextmanager
def _change():
    pending = getattr(_local, "pending", None)
    if pending is not None:
        yield pending
        return
    pending = _Pending()
    yield pending
    _apply(pending)


def run_created(run: Run) -> None:
    """A new run: its own rollup row, and one more run of its status on every ancestor."""
    column = STATUS_COLUMNS[run.status]
    RunRollup.objects.create(run=run, **{column: 1})
    if run.ancestry:
        with _change() as pending:
            pending.add_sub(run.ancestry, column, 1)


def status_changed(run: Run, old: str, new: str) -> None:
    """The one place a status change reaches the rollups; ``mark_finished`` calls it."""
    if old == new:
        return
    with _change() as pending:
        chain = chain_of(run)
        pending.add_sub(chain, STATUS_COLUMNS[old], -1)
        pending.add_sub(chain, STATUS_COLUMNS[new], 1)
        if run.finished_at is not None:
            for pk in chain:
                known = pending.last_end.get(pk)
                pending.last_end[pk] = (
                    run.finished_at if known is None else max(known, run.finished_at)
                )


def usage_added(run: Run, totals: dict[str, int]) -> list[int]:
    """A frame's usage events, summed in Python by the caller: one change per frame.

    Applied at once outside a batch; returns the pks on the chain that have a budget (the
    UPDATE returns them), for the caller to check."""
    if not any(totals.values()):
        return []
    with _change() as pending:
        chain = chain_of(run)
        for figure, delta in totals.items():
            if not delta or figure not in USAGE_COLUMNS:
                continue
            own, sub = USAGE_COLUMNS[figure]
            pending.own[run.pk][own] += delta
            pending.add_sub(chain, sub, delta)
        pending.own[run.pk]["own_usage_events"] += totals.get("events", 0)
    return sorted(pending.budgeted)


def _apply(pending: _Pending) -> None:
    if pending.empty():
        return
    pks = sorted(set(pending.sub) | set(pending.own) | set(pending.last_end))
    table = connection.ops.quote_name(RunRollup._meta.db_table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Lock in pk order (ancestors first) before any UPDATE, whose own row order is
            # the table's physical order and would let two chains deadlock. SQLite has one
            # writer at a time.
            cursor.execute(
                f"SELECT run_id FROM {table} WHERE run_id = ANY(%s) ORDER BY run_id FOR UPDATE",
                [pks],
            )
        # Rows sharing the same subtree increments take one UPDATE (a usage frame: the whole
        # chain in one statement, the run's own figures through CASE). Raw SQL: this is the
        # ingest path, where building ORM expressions cost more than the statement itself.
        groups: dict[tuple, list[int]] = defaultdict(list)
        for pk in pks:
            sub = tuple(sorted((c, d) for c, d in pending.sub.get(pk, {}).items() if d))
            groups[(sub, pending.last_end.get(pk))].append(pk)
        stamp = _db_time(timezone.now())
        for (sub, last_end), group in groups.items():
            sets, params = [], []
            for column, delta in sub:
                sets.append(f"{column} = {column} + %s")
                params.append(delta)
            if last_end is not None:
                end = _db_time(last_end)
                sets.append(
                    "sub_last_finished_at = CASE WHEN sub_last_finished_at IS NULL OR "
                    "sub_last_finished_at < %s THEN %s ELSE sub_last_finished_at END"
                )
                params += [end, end]
            own_columns = defaultdict(list)
            for pk in group:
                for column, delta in pending.own.get(pk, {}).items():
                    if delta:
                        own_columns[column].append((pk, delta))
            for column, cases in own_columns.items():
                whens = " ".join("WHEN %s THEN %s" for _ in cases)
                sets.append(f"{column} = {column} + CASE run_id {whens} ELSE 0 END")
                params += [value for case in cases for value in case]
            if not sets:
                continue
            sets.append("updated_at = %s")
            params.append(stamp)
            marks = ", ".join(["%s"] * len(group))
            cursor.execute(
                f"UPDATE {table} SET {', '.join(sets)} WHERE run_id IN ({marks}) "
                "RETURNING run_id, budgeted",
                [*params, *group],
            )
            pending.budgeted.update(pk for pk, budgeted in cursor.fetchall() if budgeted)


def _db_time(value: datetime):
    return RunRollup._meta.get_field("updated_at").get_db_prep_value(value, connection)

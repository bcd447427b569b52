"""Retention (issue 28): delete what is older than the limits, in short batches.

A pass is a sequence of steps, each one short transaction that deletes at most
``RETENTION_BATCH_SIZE`` rows, so ingest never waits long on a lock (on SQLite the write lock
is held for one batch; on PostgreSQL only the rows of that batch are locked). The upkeep loop
runs the steps one by one and yields between them; ``manage.py purge_events`` runs them in a
row. Three kinds, each with its own limit (0 keeps it forever):

1. events: the transcript of a run finished before ``EVENT_RETENTION_DAYS``. Its usage events
   stay, because rollups and budgets are counted from them; the run is marked stripped.
2. runs: a whole tree whose root (and every run in it) finished before ``RUN_RETENTION_DAYS``.
   Trees go whole, so the rollups of every run that stays are untouched. Each run leaves a
   tombstone so its page says it was purged.
3. audit entries older than ``AUDIT_RETENTION_DAYS`` (kept longest: settings enforce it).

A tree whose root has ``keep`` set is exempt from the first two. Each pass is recorded
(``RetentionPass``), audited and counted in ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from delegation import metrics, roles
from delegation.errors import PermissionRefused
from delegation.models import AuditEntry, Event, PurgedRun, RetentionPass, Run, Session
from delegation.selectors import retention as due
from delegation.services.audit import audit
from delegation.services.identity import Actor

ACTOR = Actor.system("retention")


class Pass:
    """One pass: ``step()`` does one batch and answers whether there is more to do."""

    def __init__(
        self,
        *,
        now: datetime | None = None,
        batch_size: int | None = None,
        event_days: int | None = None,
    ):
        self.cutoffs = due.cutoffs(now, event_days)
        self.batch = batch_size or settings.RETENTION_BATCH_SIZE
        self.record = RetentionPass.objects.create()
        self._steps = self._plan()

    def step(self) -> bool:
        try:
            next(self._steps)
        except StopIteration:
            self._finish("")
            return False
        except Exception as exc:
            self._finish(f"{type(exc).__name__}: {exc}")
            raise
        self.record.batches += 1
        return True

    def run(self) -> RetentionPass:
        while self.step():
            pass
        return self.record

    def _plan(self) -> Iterator[None]:
        if self.cutoffs.events is not None:
            yield from self._strip_transcripts(self.cutoffs.events)
        if self.cutoffs.runs is not None:
            yield from self._delete_trees(self.cutoffs.runs)
        if self.cutoffs.audit is not None:
            yield from self._delete_audit(self.cutoffs.audit)

    def _strip_transcripts(self, cutoff: datetime) -> Iterator[None]:
        after = 0
        while True:
            runs = list(
                due.runs_to_strip(cutoff)
                .filter(pk__gt=after)
                .values_list("pk", flat=True)[: self.batch]
            )
            if not runs:
                return
            for run_pk in runs:
                while self._delete_events(due.strippable_events([run_pk])):
                    yield
                Run.objects.filter(pk=run_pk, events_purged_at__isnull=True).update(
                    events_purged_at=timezone.now()
                )
            after = runs[-1]
            yield

    def _delete_events(self, rows) -> int:
        """One batch of ``rows`` (events) gone; how many. Events have no dependents, so a raw
        delete by primary key is safe and skips loading them."""
        with transaction.atomic():
            # In the (run, sequence) index's order: each batch is a short index range, not a
            # sort of every remaining event of the run.
            pks = list(
                rows.order_by("run_id", "sequence").values_list("pk", flat=True)[: self.batch]
            )
            if not pks:
                return 0
            deleted = Event.objects.filter(pk__in=pks)._raw_delete(Event.objects.db)
        self.record.events_deleted += deleted
        metrics.retention_deleted("events", deleted)
        return len(pks)

    def _delete_trees(self, cutoff: datetime) -> Iterator[None]:
        after = 0
        while True:
            root = due.trees_to_delete(cutoff).filter(pk__gt=after).first()
            if root is None:
                return
            after = root.pk
            tree = list(
                Run.objects.filter(Q(pk=root.pk) | Q(root_id=root.pk)).values_list("pk", flat=True)
            )
            while self._delete_events(Event.objects.filter(run_id__in=tree)):
                yield
            self._delete_tree(root, cutoff)
            yield

    def _delete_tree(self, root: Run, cutoff: datetime) -> None:
        with transaction.atomic():
            # Re-checked inside the transaction: a resume or a keep since the scan wins.
            if not due.trees_to_delete(cutoff).filter(pk=root.pk).exists():
                return
            runs = list(
                Run.objects.filter(Q(pk=root.pk) | Q(root_id=root.pk)).values_list(
                    "run_id", "finished_at", "session_id"
                )
            )
            PurgedRun.objects.bulk_create(
                [
                    PurgedRun(run_id=rid, root_run_id=root.run_id, finished_at=at)
                    for rid, at, _ in runs
                ],
                ignore_conflicts=True,
            )
            Run.objects.filter(pk=root.pk).delete()  # the descendants go with it (CASCADE)
            self._drop_empty_sessions({session for _, _, session in runs})
        self.record.runs_deleted += len(runs)
        self.record.trees_deleted += 1
        metrics.retention_deleted("runs", len(runs))

    @staticmethod
    def _drop_empty_sessions(pks: set[int]) -> None:
        """Sessions left without runs or child sessions go too (leaves first, so deleting one
        never cascades into a session that still has runs)."""
        while pks:
            empty = Session.objects.filter(pk__in=pks, runs__isnull=True, children__isnull=True)
            parents = set(empty.exclude(parent_id=None).values_list("parent_id", flat=True))
            if not empty.exists():
                return
            Session.objects.filter(pk__in=list(empty.values_list("pk", flat=True))).delete()
            pks = parents

    def _delete_audit(self, cutoff: datetime) -> Iterator[None]:
        while True:
            with transaction.atomic():
                pks = list(due.audit_to_delete(cutoff).values_list("pk", flat=True)[: self.batch])
                if not pks:
                    return
                # Through the collector: a steer receipt's link to its entry is set to NULL.
                AuditEntry.objects.filter(pk__in=pks).delete()
            self.record.audit_deleted += len(pks)
            metrics.retention_deleted("audit", len(pks))
            yield

    def _finish(self, error: str) -> None:
        record = self.record
        record.finished_at = timezone.now()
        record.error = error
        record.save()
        detail = {
            "events": record.events_deleted,
            "runs": record.runs_deleted,
            "trees": record.trees_deleted,
            "audit": record.audit_deleted,
            "batches": record.batches,
            "seconds": round(record.seconds or 0, 3),
        }
        audit(ACTOR, "retention.pass", "retention", str(record.pk), error or "ok", detail=detail)
        metrics.retention_pass("failed" if error else "ok")


def do_retention_pass(
    *, now: datetime | None = None, batch_size: int | None = None, event_days: int | None = None
) -> RetentionPass:
    """A whole pass in a row (the management command, tests)."""
    return Pass(now=now, batch_size=batch_size, event_days=event_days).run()


def pass_is_due(now: datetime | None = None) -> bool:
    """Whether the upkeep loop should start a pass: some limit is set and no pass started within
    the last ``RETENTION_INTERVAL_SECONDS`` (in any process: they share the record)."""
    if not due.cutoffs(now).any:
        return False
    last = due.last_passes(1)
    if not last:
        return True
    age = ((now or timezone.now()) - last[0].started_at).total_seconds()
    return age >= settings.RETENTION_INTERVAL_SECONDS


def do_set_keep(*, actor: Actor, run_id: str, keep: bool) -> Run:
    """Exempt a tree from retention (or stop exempting it). Admins only; audited either way."""
    with transaction.atomic():
        root = Run.objects.select_for_update().filter(run_id=run_id, root__isnull=True).first()
        if not roles.can_admin(actor.user):
            audit(actor, "retention.keep", "run", run_id, "refused: not an admin")
            refused = PermissionRefused(
                f"{actor.label} is not an admin; keeping a tree needs admin"
            )
        elif root is None:
            refused = PermissionRefused(f"no tree with root run {run_id!r}")
        else:
            root.keep = keep
            root.save(update_fields=["keep"])
            audit(actor, "retention.keep", "run", run_id, "kept" if keep else "not kept")
            return root
    raise refused

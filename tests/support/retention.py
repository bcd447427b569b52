"""Trees for the retention tests and bench: grown through the runner's real service calls (so
their rollups are the real ones), finished, then aged by moving every timestamp of the tree
back by the same amount (the rollups' newest-finish moves with them, so a recount still
equals them)."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import F, Q

from delegation.models import AuditEntry, Event, Run, RunRollup
from delegation.runner_socket import methods
from tests.support.concurrency import start_params


def _usage(tokens_in: int) -> dict:
    return {
        "kind": "usage",
        "input": {"inputTokens": tokens_in, "outputTokens": 2, "costUsd": 0.01},
    }


def grow_tree(conn, name: str, children: int = 2, texts: int = 4, finish: bool = True) -> Run:
    """A root with ``children`` children, each run with ``texts`` text events and one usage
    event; all finished unless ``finish`` is False (then the root and children keep running)."""
    methods.open_run(conn, {"conversationId": f"c-{name}", "runId": name})
    ids = [name]
    for n in range(children):
        child = methods.child_start(conn, start_params(name, f"{name}-q{n}"))
        ids.append(child["runId"])
    for run_id in ids:
        events = [{"kind": "text", "text": f"{run_id} {i}"} for i in range(texts)]
        methods.append_event_frame(
            conn, {"runId": run_id, "from": 1, "events": [*events, _usage(10)]}
        )
    if finish:
        for run_id in reversed(ids):
            methods.finish_run(conn, {"runId": run_id, "output": "done"})
    return Run.objects.get(run_id=name)


def age_tree(root: Run, days: float) -> None:
    delta = timedelta(days=days)
    tree = Run.objects.filter(Q(pk=root.pk) | Q(root_id=root.pk))
    pks = list(tree.values_list("pk", flat=True))
    tree.update(finished_at=F("finished_at") - delta, created_at=F("created_at") - delta)
    RunRollup.objects.filter(run_id__in=pks, sub_last_finished_at__isnull=False).update(
        sub_last_finished_at=F("sub_last_finished_at") - delta
    )
    Event.objects.filter(run_id__in=pks).update(created_at=F("created_at") - delta)


def age_audit(days: float, **match) -> int:
    return AuditEntry.objects.filter(**match).update(
        created_at=F("created_at") - timedelta(days=days)
    )


def tree_runs(root_id: str) -> list[str]:
    root = Run.objects.get(run_id=root_id)
    return sorted(Run.objects.filter(Q(pk=root.pk) | Q(root=root)).values_list("run_id", flat=True))

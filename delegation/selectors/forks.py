"""Fork links (SPEC §14): which run a run was forked from, at which step, and its forks."""

from __future__ import annotations

from django.db.models import Q

from delegation.models import Event, Run


def fork_links(run: Run) -> dict:
    """Which run (and step) this one was forked from, and the runs forked from it."""
    links = run_links(run)
    return {"forkedFrom": links["forkedFrom"], "forks": links["forks"]}


def run_links(run: Run) -> dict:
    """REST's links of a run: relaunched from and relaunches, forked from and forks, the runs
    made from it read in one query (a run's detail keeps a fixed number of queries)."""
    forked_from = None
    if run.forked_from_id:
        forked_from = {"runId": run.forked_from.run_id, "sequence": run.forked_from_sequence}
    made = (
        Run.objects.filter(Q(relaunched_from=run) | Q(forked_from=run))
        .order_by("created_at", "id")
        .values_list("run_id", "relaunched_from_id", "forked_from_id", "forked_from_sequence")
    )
    relaunches, forks = [], []
    for run_id, relaunched_from, forked_from_pk, step in made:
        if relaunched_from == run.pk:
            relaunches.append(run_id)
        if forked_from_pk == run.pk:
            forks.append({"runId": run_id, "sequence": step})
    return {
        "relaunchedFrom": run.relaunched_from.run_id if run.relaunched_from_id else None,
        "relaunches": relaunches,
        "forkedFrom": forked_from,
        "forks": forks,
    }


def child_fork_step(run: Run) -> int | None:
    """A ``contextMode: "fork"`` child's step of its parent: the parent's last event when the
    child was started (what the fork's conversation holds)."""
    if run.context_mode != "fork" or not run.parent_id:
        return None
    return (
        Event.objects.filter(run_id=run.parent_id, created_at__lte=run.created_at)
        .order_by("-sequence")
        .values_list("sequence", flat=True)
        .first()
    )


def fork_relation(a_run_id: str, b_run_id: str) -> str:
    """How two compared runs are forks of each other, in words ("" when they are not)."""
    pairs = Run.objects.filter(run_id__in=(a_run_id, b_run_id)).values_list(
        "run_id", "forked_from__run_id", "forked_from_sequence"
    )
    for run_id, origin, step in pairs:
        other = b_run_id if run_id == a_run_id else a_run_id
        if origin and origin == other:
            side = "right" if run_id == b_run_id else "left"
            at = f"step {step}" if step else "its end"
            return f"The {side} run is a fork of the other at {at}."
    return ""

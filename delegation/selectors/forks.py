"""Fork links (SPEC §14): which run a run was forked from, at which step, and its forks."""

from __future__ import annotations

from delegation.models import Run


def fork_links(run: Run) -> dict:
    """Which run (and step) this one was forked from, and the runs forked from it."""
    forked_from = None
    if run.forked_from_id:
        forked_from = {"runId": run.forked_from.run_id, "sequence": run.forked_from_sequence}
    forks = [
        {"runId": run_id, "sequence": seq}
        for run_id, seq in Run.objects.filter(forked_from=run)
        .order_by("created_at", "id")
        .values_list("run_id", "forked_from_sequence")
    ]
    return {"forkedFrom": forked_from, "forks": forks}

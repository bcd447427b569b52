"""Pause and resume (SPEC §14), one code path for REST, the run page, the admin and budgets.

A pause stores status ``paused`` and a ``paused`` event, then sends the runner ``run.pause``
(its agent's processes are stopped); a resume stores ``running`` and a ``resumed`` event and
sends ``run.resume``. Each is audited. The time a run spends paused is kept on the run
(``paused_seconds``, ``paused_at``) so ``maxSeconds`` counts only the time it ran.
Pending approvals are left alone: they keep waiting (SPEC §14).
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from delegation.models import Command, Run, RunStatus
from delegation.selectors import live_descendants
from delegation.services import rollups
from delegation.services.audit import audit, require_operator
from delegation.services.base import lock_run, store_server_event
from delegation.services.identity import Actor
from delegation.services.locks import retry_conflicts
from delegation.services.outbox import enqueue


def request_pause(actor: Actor, run: Run, reason: str) -> str:
    """Pause one run (the caller holds the transaction); the outcome as reported."""
    run = lock_run(run.pk)
    if run.is_terminal:
        return "already-finished"
    if run.cancel_requested_at is not None:
        # Stopping a run that is ending would only hold its cancel up.
        return "cancel-requested"
    if run.status == RunStatus.PAUSED:
        return "already-paused"
    old = run.status
    run.status = RunStatus.PAUSED
    run.paused_at = timezone.now()
    run.pause_reason = reason
    run.save(update_fields=["status", "paused_at", "pause_reason"])
    rollups.status_changed(run, old, run.status)
    text = f"paused by {actor.label}" + (f": {reason}" if reason else "")
    store_server_event(run, "paused", actor=actor.label, text=text)
    enqueue(
        run.runner_id,
        Command.Method.RUN_PAUSE,
        {"runId": run.run_id, "reason": reason or "paused"},
        run=run,
    )
    return "paused"


def request_resume(actor: Actor, run: Run) -> str:
    run = lock_run(run.pk)
    if run.is_terminal:
        return "already-finished"
    if run.status != RunStatus.PAUSED:
        return "not-paused"
    now = timezone.now()
    old = run.status
    run.status = RunStatus.RUNNING
    run.paused_seconds = run.paused_for(now)
    run.paused_at = None
    run.save(update_fields=["status", "paused_seconds", "paused_at"])
    rollups.status_changed(run, old, run.status)
    store_server_event(run, "resumed", actor=actor.label, text=f"resumed by {actor.label}")
    enqueue(run.runner_id, Command.Method.RUN_RESUME, {"runId": run.run_id}, run=run)
    return "resumed"


@retry_conflicts
def do_pause_run(actor: Actor, run: Run, *, reason: str = "", subtree: bool = False) -> dict:
    """Pause a run, and with ``subtree`` every live run below it, reporting each one."""
    return _act(actor, run, "pause", subtree, reason, lambda r: request_pause(actor, r, reason))


@retry_conflicts
def do_resume_run(actor: Actor, run: Run, *, reason: str = "", subtree: bool = False) -> dict:
    """Resume a paused run, and with ``subtree`` every paused run below it."""
    return _act(actor, run, "resume", subtree, reason, lambda r: request_resume(actor, r))


def _act(actor: Actor, run: Run, verb: str, subtree: bool, reason: str, one) -> dict:
    action = f"{verb}-subtree" if subtree else verb
    require_operator(actor, action, "run", run.run_id, reason)
    with transaction.atomic(), rollups.batch():
        outcome = one(run)
        descendants = []
        if subtree:
            for descendant in live_descendants(run):
                descendants.append(
                    {
                        "runId": descendant.run_id,
                        "depth": descendant.depth,
                        "outcome": one(descendant),
                    }
                )
        report = {"runId": run.run_id, "outcome": outcome, "descendants": descendants}
        audit(actor, action, "run", run.run_id, outcome, reason=reason, detail=report)
        return report

"""A run's life: ``create_run`` stores it, ``dispatch`` sends it to its runner, ``mark_finished``
ends it. Every path that creates or ends a run goes through here, whichever door it came by:
``run.open`` (a runner's own top-level run), ``child.start`` (runner socket and MCP) and launch
(REST, dashboard, ``manage.py launch``); and every terminal transition (``run.finish``, a
refused ``child.execute``, a lost runner or host instance).

Persist first, doorbell after: ``create_run`` writes the session and run rows and the run's
rollup row; a budget, if any, is stored by the caller between the two steps; ``dispatch``
snapshots the stored identity, queues ``run.execute``/``child.execute`` in the outbox and
rings the doorbells on commit, so a runner never hears of a run the database does not hold.
"""

from __future__ import annotations

import uuid

from django.utils import timezone

from delegation import notify
from delegation.errors import INVALID_PARAMS, RpcError
from delegation.models import Run, Runner, RunStatus, Session
from delegation.selectors import RESULT_RELATED, snapshot
from delegation.services import approval_endings, rollups, webhooks
from delegation.services.base import task_of
from delegation.services.outbox import enqueue
from delegation.tracing import queue as trace_queue
from delegation.wire import confine_cwd

# The Result fields that name a run: what child.execute / run.execute carry as ``identity``.
IDENTITY_KEYS = (
    "runnerId",
    "hostInstanceId",
    "conversationId",
    "runId",
    "parentConversationId",
    "parentRunId",
    "extensionId",
    "profile",
)


def confined_cwd(runner: Runner, cwd: str | None, *, field: str) -> str:
    """The working directory inside the runner's declared workspace (−32602 naming ``field``)."""
    if not cwd or not runner.workspace:
        return cwd or ""
    try:
        return confine_cwd(cwd, runner.workspace)
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"{field}: {exc}") from None


def new_session(
    *,
    runner: Runner,
    depth: int,
    extension_id: str,
    profile: str,
    parent: Session | None = None,
    conversation_id: str | None = None,
) -> Session:
    """A conversation of this runner, on its current host instance."""
    return Session.objects.create(
        conversation_id=conversation_id or f"c-{uuid.uuid4().hex}",
        runner=runner,
        depth=depth,
        parent=parent,
        extension_id=extension_id,
        profile=profile,
        host_instance_id=runner.host_instance_id,
    )


def create_run(
    *,
    runner: Runner,
    session: Session,
    run_id: str | None = None,
    parent: Run | None = None,
    request: dict | None = None,
    **fields,
) -> Run:
    """Store a run (and its rollup row) in ``session``, under ``parent`` when it is a child.

    ``fields`` are the run's own columns (depth, extension, profile, preset, options, cwd,
    via, lease, ...). The caller holds whatever locks its admission needed; nothing is sent
    until ``dispatch``.
    """
    now = timezone.now()
    if parent is not None:
        fields["root_id"] = parent.root_id or parent.pk
        fields["ancestry"] = rollups.chain_of(parent)
    if request is not None:
        fields["task"] = task_of(request)
    run = Run.objects.create(
        run_id=run_id or f"r-{uuid.uuid4().hex}",
        session=session,
        runner=runner,
        parent=parent,
        host_instance_id=runner.host_instance_id,
        request=request,
        created_at=now,
        updated_at=now,
        **fields,
    )
    rollups.run_created(run)
    return run


def dispatch(
    run: Run, *, method: str, lease_id: str | None = None, fork_from: dict | None = None
) -> dict:
    """Queue the run's execute command for its runner; answers the stored ``Result``.

    The snapshot is read back after every write of the creating transaction (a budget
    included), so the identity sent is exactly the durable one.
    """
    run = Run.objects.select_related(*RESULT_RELATED).get(pk=run.pk)
    result = snapshot(run)
    execute = {
        "identity": {key: result[key] for key in IDENTITY_KEYS},
        "request": run.request,
        "preset": run.preset,
        "depth": run.depth,
    }
    if lease_id is not None:
        execute["leaseId"] = lease_id
    if fork_from is not None:
        execute["forkFrom"] = fork_from  # SPEC §14 fork from here (services/forks.py)
    enqueue(run.runner_id, method, execute, run=run)
    announce(run)
    return result


def announce(run: Run) -> None:
    """Tell the dashboards a run appeared, once the transaction that stored it commits."""
    notify.run_changed(run, new_run=True)


def mark_finished(run: Run, status: str, *, error: str = "", output: str | None = None):
    """Every terminal transition goes through here, and so reaches the rollups (run the caller
    inside ``rollups.batch()`` when it locks other runs afterwards) and the alerts."""
    old = run.status
    if run.paused_at is not None:
        # Ended while paused (a cancel, a lost runner): its last pause ends here.
        run.paused_seconds = run.paused_for(timezone.now())
        run.paused_at = None
    run.status = status
    run.done = True
    run.cancelled = status == RunStatus.CANCELLED
    if error:
        run.error = error
    if output is not None:
        run.output = output
    run.finished_at = run.updated_at = timezone.now()
    run.save(
        update_fields=[
            "status",
            "done",
            "cancelled",
            "error",
            "output",
            "finished_at",
            "updated_at",
            "paused_seconds",
            "paused_at",
        ]
    )
    rollups.status_changed(run, old, status)
    # An agent still waiting on an approval has stopped waiting: nobody may allow it now.
    approval_endings.deny_pending(run, reason="run cancelled" if run.cancelled else "run ended")
    notify.run_changed(run)
    webhooks.run_finished(run)
    trace_queue.run_ended(run)

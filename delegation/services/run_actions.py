"""Actions on a run or a lease, one code path for runners, MCP, the dashboard, the admin and
REST, each permission-checked and audited: cancel (``do_cancel_run``), steer (``do_steer_run``:
where ``child.steer``, ``steer_child`` and ``POST /api/runs/{runId}/steer`` all land) and
lease release (``do_release_lease``, ``release_lease``). Named for what it acts on (it was
``operator.py``, issue 34); pause and resume are ``pause``, budgets ``budgets``.

``Actor``, ``audit`` and ``require_operator`` live in ``identity`` and ``audit`` (the layers
below); they are importable from here too, where the doors have always found them.
"""

from __future__ import annotations

import asyncio
import time

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from delegation.errors import (
    ADMISSION_REFUSED,
    INVALID_PARAMS,
    RELEASE_UNCONFIRMED,
    REQUEST_ID_REUSED,
    RpcError,
)
from delegation.models import (
    Command,
    Lease,
    LeaseState,
    Run,
    RunStatus,
    SteerReceipt,
)
from delegation.protocol import MAX_STEER_BYTES
from delegation.selectors import live_descendants
from delegation.services.approval_endings import deny_pending
from delegation.services.audit import audit, require_operator
from delegation.services.base import lock_run, store_server_event
from delegation.services.identity import Actor
from delegation.services.locks import retry_conflicts
from delegation.services.outbox import enqueue
from delegation.wire import utf8_len, valid_id

MAX_STEER_RECEIPTS = 128


def request_cancel(actor: Actor, run: Run, reason: str) -> str:
    """Record the request and tell the runner; the run stops when the runner confirms."""
    run = lock_run(run.pk)
    if run.is_terminal:
        return "already-finished"
    if run.cancel_requested_at is not None:
        return "already-requested"
    run.cancel_requested_at = timezone.now()
    run.cancel_reason = reason
    run.save(update_fields=["cancel_requested_at", "cancel_reason"])
    text = f"cancel requested by {actor.label}" + (f": {reason}" if reason else "")
    store_server_event(run, "cancel-requested", actor=actor.label, text=text)
    deny_pending(run, reason="run cancelled")
    enqueue(
        run.runner_id,
        Command.Method.RUN_CANCEL,
        {"runId": run.run_id, "reason": reason or "cancelled"},
        run=run,
    )
    return "requested"


@retry_conflicts
def do_cancel_run(actor: Actor, run: Run, *, reason: str = "", cascade: bool = False) -> dict:
    """Cancel a run, and with ``cascade`` every live descendant, reporting each one."""
    action = "cancel-subtree" if cascade else "cancel"
    require_operator(actor, action, "run", run.run_id, reason)
    with transaction.atomic():
        outcome = request_cancel(actor, run, reason)
        descendants = []
        if cascade:
            for descendant in live_descendants(run):
                descendants.append(
                    {
                        "runId": descendant.run_id,
                        "depth": descendant.depth,
                        "outcome": request_cancel(actor, descendant, reason),
                    }
                )
        report = {"runId": run.run_id, "outcome": outcome, "descendants": descendants}
        audit(actor, action, "run", run.run_id, outcome, reason=reason, detail=report)
        return report


@retry_conflicts
def do_steer_run(actor: Actor, run: Run, *, request_id: str, message: str) -> dict:
    """Queue a message for a running run; idempotent per child session by requestId."""
    # Long for its idempotency: a repeated requestId answers the first receipt, a changed
    # message under one requestId is refused, each with its audit entry.
    require_operator(actor, "steer", "run", run.run_id)
    try:
        valid_id(request_id, "requestId")
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"requestId: {exc}") from None
    if message.strip() == "":
        raise RpcError(INVALID_PARAMS, "message: must not be blank")
    if utf8_len(message) > MAX_STEER_BYTES:
        raise RpcError(INVALID_PARAMS, f"message: must be at most {MAX_STEER_BYTES} bytes")
    with transaction.atomic():
        run = lock_run(run.pk)
        session = run.session
        receipt = SteerReceipt.objects.filter(session=session, request_id=request_id).first()
        if receipt is not None:
            if receipt.message != message:
                raise RpcError(
                    REQUEST_ID_REUSED,
                    f"requestId: {request_id!r} was already used for this child with a "
                    "different message",
                )
            return _steer_answer(receipt.outcome, receipt.reason)
        if SteerReceipt.objects.filter(session=session).count() >= MAX_STEER_RECEIPTS:
            raise RpcError(
                ADMISSION_REFUSED,
                f"admission refused: at most {MAX_STEER_RECEIPTS} steer requests per child",
            )
        if run.status == RunStatus.RUNNING and run.cancel_requested_at is None:
            outcome, reason = "injected", ""
        else:
            outcome, reason = "promptRequired", "noRunningTurn"
        receipt = SteerReceipt.objects.create(
            session=session,
            run=run,
            request_id=request_id,
            message=message,
            outcome=outcome,
            reason=reason,
            actor=actor.label,
        )
        if outcome == "injected":
            store_server_event(
                run,
                "steer",
                actor=actor.label,
                text=message,
                data={"requestId": request_id},
            )
            enqueue(
                run.runner_id,
                Command.Method.RUN_STEER,
                {"runId": run.run_id},
                run=run,
                steer=receipt,
            )
        receipt.audit_entry = audit(
            actor,
            "steer",
            "run",
            run.run_id,
            outcome,
            detail={"message": message[:500], "reason": reason},
        )
        receipt.save(update_fields=["audit_entry"])
        return _steer_answer(outcome, reason)


def _steer_answer(outcome: str, reason: str) -> dict:
    answer = {"outcome": outcome}
    if reason:
        answer["reason"] = reason
    return answer


@retry_conflicts
def do_release_lease(
    actor: Actor, lease: Lease, *, state: str = LeaseState.RELEASED, reason: str = ""
) -> dict:
    """Revoke a lease and cancel every child under it (SPEC §6 child.lease.release).

    The write step only, answering at once: the doors call ``release_lease`` (or, on the
    runner socket, ``await_release``), which add SPEC §6's wait for the children; the
    sweep and a lost runner end leases without waiting."""
    require_operator(actor, "release", "lease", lease.lease_id, reason)
    with transaction.atomic():
        lease = (
            Lease.objects.select_for_update(of=("self",)).select_related("runner").get(pk=lease.pk)
        )
        first_time = lease.state == LeaseState.ACTIVE
        if first_time:
            lease.state = state
            lease.ended_at = timezone.now()
            lease.save(update_fields=["state", "ended_at"])
            if lease.parent_run_id:
                parent = lock_run(lease.parent_run_id)
                store_server_event(
                    parent,
                    "lease-released",
                    actor=actor.label,
                    text=f"lease {lease.lease_id} {state} by {actor.label}",
                    data={"leaseId": lease.lease_id, "state": state},
                )
            if actor.runner_pk != lease.runner_id:
                enqueue(lease.runner_id, Command.Method.LEASE_REVOKED, {"leaseId": lease.lease_id})
        why = f"lease {lease.lease_id} {lease.state}"
        for child in Run.objects.filter(lease=lease).live():
            request_cancel(actor, child, why)
        pending = lease_pending(lease.pk)
        audit(
            actor,
            "release",
            "lease",
            lease.lease_id,
            ("released" if first_time else "already-" + lease.state),
            reason=reason,
            detail={"runner": lease.runner.name, "pending": pending},
        )
        return {"done": not pending, "pending": pending, "state": lease.state}


def lease_pending(lease_pk: int) -> list[str]:
    return list(Run.objects.filter(lease_id=lease_pk).live().values_list("run_id", flat=True))


# SPEC §6: a release waits up to LEASE_RELEASE_WAIT_SECONDS (5 s) for the lease's children to
# finish, then answers −32016 if they have not; the same rule for every door.
RELEASE_POLL_SECONDS = 0.05


def unconfirmed_release(pending: list[str]) -> RpcError:
    return RpcError(
        RELEASE_UNCONFIRMED,
        "cleanup is not yet confirmed; retry release",
        data={"pending": pending},
    )


def release_lease(actor: Actor, lease: Lease, *, reason: str = "") -> dict:
    """An operator's release (REST, dashboard, admin): the write, then SPEC §6's wait.

    Answers the report (``done``, ``pending``, ``state``) once the children have finished or
    the wait is over: ``pending`` is what −32016 names on the runner socket, and a repeated
    call polls. Inside a caller's transaction there is no wait: the cancels it holds locked
    could not finish before it commits.
    """
    report = do_release_lease(actor, lease, reason=reason)
    if report["pending"] and not transaction.get_connection().in_atomic_block:
        deadline = time.monotonic() + settings.LEASE_RELEASE_WAIT_SECONDS
        while report["pending"] and time.monotonic() < deadline:
            time.sleep(RELEASE_POLL_SECONDS)
            report["pending"] = lease_pending(lease.pk)
        report["done"] = not report["pending"]
    return report


async def await_release(lease_pk: int) -> dict:
    """The runner socket's wait: asynchronous, because the children it waits for finish
    through frames on that very socket. ``{"done": true}``, or −32016 naming the pending."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.LEASE_RELEASE_WAIT_SECONDS
    while True:
        pending = await database_sync_to_async(lease_pending)(lease_pk)
        if not pending:
            return {"done": True}
        if loop.time() >= deadline:
            raise unconfirmed_release(pending)
        await asyncio.sleep(RELEASE_POLL_SECONDS)

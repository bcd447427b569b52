"""Operator actions, one code path for runners, the dashboard, the admin and REST: cancel,
steer and release, each permission-checked and audited."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from delegation import roles
from delegation.errors import (
    ADMISSION_REFUSED,
    INVALID_PARAMS,
    REQUEST_ID_REUSED,
    PermissionRefused,
    RpcError,
)
from delegation.models import (
    AuditEntry,
    Command,
    Lease,
    LeaseState,
    Run,
    Runner,
    RunStatus,
    SteerReceipt,
)
from delegation.protocol import MAX_STEER_BYTES
from delegation.services.base import lock_run, store_server_event
from delegation.services.outbox import enqueue
from delegation.wire import utf8_len, valid_id

MAX_STEER_RECEIPTS = 128


@dataclass(frozen=True)
class Actor:
    """Who performs an action, for permission checks, event attribution and the audit log."""

    label: str
    via: str
    user: object | None = None
    runner_pk: int | None = None

    @classmethod
    def for_user(cls, user, via: str) -> Actor:
        return cls(label=f"user:{user.get_username()}", via=via, user=user)

    @classmethod
    def for_runner(cls, runner: Runner, via: str = AuditEntry.Via.RUNNER) -> Actor:
        """The runner itself, or (``via`` mcp) an agent it hosts, holding a run token."""
        return cls(label=f"{via}:{runner.name}", via=via, runner_pk=runner.pk)

    @classmethod
    def system(cls, why: str = "system") -> Actor:
        return cls(label=why, via=AuditEntry.Via.SYSTEM)


def audit(actor: Actor, action: str, target_type: str, target_id: str, outcome: str, **kw):
    return AuditEntry.objects.create(
        actor=actor.label,
        user=actor.user if actor.user is not None else None,
        via=actor.via,
        action=action,
        target_type=target_type,
        target_id=target_id,
        outcome=outcome,
        reason=kw.get("reason", ""),
        detail=kw.get("detail", {}),
    )


ROLELESS_AUDIT_SECONDS = 60


def _refusal_audited_lately(actor: Actor) -> bool:
    """A signed-in user without any role may try actions in a loop: the first refusal of a
    minute is audited, the rest would only fill the log. Viewers are audited every time."""
    if roles.role_of(actor.user) is not None:
        return False
    since = timezone.now() - timedelta(seconds=ROLELESS_AUDIT_SECONDS)
    return AuditEntry.objects.filter(
        user=actor.user, outcome="refused: not an operator", created_at__gte=since
    ).exists()


def require_operator(actor: Actor, action: str, target_type: str, target_id: str, reason=""):
    """People need the operator role; runners were authorised by their own rules already."""
    if actor.user is None:
        return
    if roles.can_act(actor.user):
        return
    # The refusal is audited in its own transaction so it survives the caller's rollback.
    with transaction.atomic():
        if not _refusal_audited_lately(actor):
            audit(actor, action, target_type, target_id, "refused: not an operator", reason=reason)
    scope = " (a read-only API token)" if getattr(actor.user, roles.READ_ONLY_SCOPE, False) else ""
    raise PermissionRefused(
        f"{actor.label} has role {roles.role_of(actor.user) or 'none'}{scope}; "
        f"{action} needs operator"
    )


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
    enqueue(
        run.runner_id,
        Command.Method.RUN_CANCEL,
        {"runId": run.run_id, "reason": reason or "cancelled"},
        run=run,
    )
    return "requested"


def do_cancel_run(actor: Actor, run: Run, *, reason: str = "", cascade: bool = False) -> dict:
    """Cancel a run, and with ``cascade`` every live descendant, reporting each one."""
    action = "cancel-subtree" if cascade else "cancel"
    require_operator(actor, action, "run", run.run_id, reason)
    with transaction.atomic():
        outcome = request_cancel(actor, run, reason)
        descendants = []
        if cascade:
            from delegation.selectors import live_descendants

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


def do_steer_run(actor: Actor, run: Run, *, request_id: str, message: str) -> dict:
    """Queue a message for a running run; idempotent per child session by requestId."""
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


def do_release_lease(actor: Actor, lease: Lease, *, state: str = LeaseState.RELEASED) -> dict:
    """Revoke a lease and cancel every child under it (SPEC §6 child.lease.release)."""
    require_operator(actor, "release", "lease", lease.lease_id)
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
        reason = f"lease {lease.lease_id} {lease.state}"
        for child in Run.objects.filter(lease=lease).live():
            request_cancel(actor, child, reason)
        pending = lease_pending(lease.pk)
        audit(
            actor,
            "release",
            "lease",
            lease.lease_id,
            ("released" if first_time else "already-" + lease.state),
            detail={"runner": lease.runner.name, "pending": pending},
        )
        return {"done": not pending, "pending": pending, "state": lease.state}


def lease_pending(lease_pk: int) -> list[str]:
    return list(Run.objects.filter(lease_id=lease_pk).live().values_list("run_id", flat=True))

"""How pending approvals end without a person: denied when their run is cancelled or ends,
expired by the sweep after ``APPROVAL_TIMEOUT_SECONDS`` (SPEC §11). Decisions themselves
are ``approvals``."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from delegation.models import Approval, ApprovalStatus, Run
from delegation.services.approvals import decide, decide_if_pending


def deny_pending(run: Run, *, reason: str, by: str = "cancel") -> int:
    """Deny every pending approval of ``run`` (held locked by the caller): a cancel, or the
    run ending while its agent still waited."""
    count = 0
    for approval in Approval.objects.select_for_update(of=("self",)).filter(
        run=run, status=ApprovalStatus.PENDING
    ):
        decide(approval, run, decision="deny", by=by, message=reason)
        count += 1
    return count


def expire_due(now=None) -> list[str]:
    """The sweep's step: deny (``expired``) each approval pending longer than the timeout."""
    now = now or timezone.now()
    seconds = settings.APPROVAL_TIMEOUT_SECONDS
    due = Approval.objects.filter(
        status=ApprovalStatus.PENDING, requested_at__lte=now - timedelta(seconds=seconds)
    )
    expired = []
    for pk, run_pk, approval_id in due.values_list("pk", "run_id", "approval_id"):
        if expire_one(pk, run_pk):
            expired.append(approval_id)
    return expired


def _timed_out(run: Run, approval: Approval) -> dict:
    seconds = settings.APPROVAL_TIMEOUT_SECONDS
    return {
        "decision": "deny",
        "by": "timeout",
        "message": f"no decision within {seconds:g} s",
        "status": ApprovalStatus.EXPIRED,
    }


def expire_one(approval_pk: int, run_pk: int) -> bool:
    return decide_if_pending(approval_pk, run_pk, _timed_out)

"""The audit log and the operator-role gate every action passes, whichever door it came in by."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from delegation import roles
from delegation.errors import PermissionRefused
from delegation.models import AuditEntry
from delegation.services.identity import Actor


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

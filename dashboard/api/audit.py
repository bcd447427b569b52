"""The audit log: every action, refused ones included."""

from ninja import Query, Router, Schema
from pydantic import Field

from dashboard.api.core import DEFAULT_LIMIT, LIST, has_nul, keyset_page, strict_query
from dashboard.api.schemas.audit import AuditPage
from dashboard.api.schemas.common import LimitParam, QueryTime, cursor_param
from delegation import selectors
from delegation.models import AuditEntry

router = Router()


class AuditFilters(Schema):
    action: str = Field(default=None, description="cancel, cancel-subtree, steer, release, ...")
    actor: str = Field(
        default=None,
        description='Case-insensitive substring of the actor label, e.g. "alice" for "user:alice"',
    )
    user: str = Field(default=None, description="Username")
    via: AuditEntry.Via = None
    target_type: str = Field(default=None, description="run, lease or runner")
    target_id: str = Field(default=None, description="runId, leaseId or runnerId")
    outcome: str = Field(
        default=None, description='Case-insensitive substring, e.g. "refused" for any refusal'
    )
    created_after: QueryTime = None
    created_before: QueryTime = None
    cursor: cursor_param("a") = None
    limit: LimitParam = DEFAULT_LIMIT


@router.get(
    "/audit",
    response={200: AuditPage, **LIST},
    tags=["audit"],
    summary="Audit entries, newest first",
    description="Every action (cancel, steer, release - also refused ones) with who, via "
    "what, which target, when, why and the outcome.",
)
@strict_query(AuditFilters)
def list_audit(request, filters: Query[AuditFilters]):
    strings = (filters.action, filters.actor, filters.user, filters.target_type)
    if has_nul(*strings, filters.target_id, filters.outcome):
        return {"items": [], "next": None}
    rows = selectors.audit_rows(
        selectors.audit_entries(
            action=filters.action,
            actor=filters.actor,
            user=filters.user,
            via=filters.via,
            target_type=filters.target_type,
            target_id=filters.target_id,
            outcome=filters.outcome,
            created_after=filters.created_after,
            created_before=filters.created_before,
        )
    )
    page = keyset_page(rows, "a", filters.cursor, filters.limit)
    for item in page["items"]:
        item["id"] = item["pk"]
        item["user"] = item.pop("username") or ""
        item["detail"] = item["detail"] or {}
    return page

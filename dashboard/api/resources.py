"""Sessions, leases, runners and the audit log; and the lease release action."""

from django.http import Http404
from django.utils import timezone
from ninja import Query, Router, Schema
from pydantic import Field

from dashboard.api.core import DEFAULT_LIMIT, actor_for, keyset_page, strict_query
from dashboard.api.runs import ACT, LIST, READ, NoParams, counts_out, has_nul, run_item
from dashboard.api.schemas import (
    AuditPage,
    DepthParam,
    IdParam,
    LeaseItem,
    LeasePage,
    LimitParam,
    QueryBool,
    QueryTime,
    ReleaseBody,
    ReleaseOutcome,
    RunnerDetail,
    RunnerPage,
    SessionDetail,
    SessionPage,
    cursor_param,
)
from delegation import selectors
from delegation.models import AuditEntry, LeaseState
from delegation.services import operator

router = Router()

# --- Sessions ----------------------------------------------------------------------------------


class SessionFilters(Schema):
    runner: str = Field(default=None, description="runnerId")
    depth: DepthParam = Field(default=None, description="Exactly this depth")
    parent: str = Field(default=None, description="conversationId of the parent session")
    profile: str = None
    created_after: QueryTime = Field(default=None, description="Created at or after")
    created_before: QueryTime = Field(default=None, description="Created strictly before")
    cursor: cursor_param("s") = None
    limit: LimitParam = DEFAULT_LIMIT


def session_item(row: dict) -> dict:
    item = dict(row)
    if item["parentConversationId"] is None:
        item["parentConversationId"] = ""
    return item


@router.get(
    "/sessions",
    response={200: SessionPage, **LIST},
    tags=["sessions"],
    summary="List sessions (conversations), newest first",
)
@strict_query(SessionFilters)
def list_sessions(request, filters: Query[SessionFilters]):
    if has_nul(filters.runner, filters.parent, filters.profile):
        return {"items": [], "next": None}
    rows = selectors.sessions_matching(
        runner=filters.runner,
        depth=filters.depth,
        parent=filters.parent,
        profile=filters.profile,
        created_after=filters.created_after,
        created_before=filters.created_before,
    )
    page = keyset_page(rows, "s", filters.cursor, filters.limit)
    page["items"] = [session_item(row) for row in page["items"]]
    return page


@router.get(
    "/sessions/{conversationId}",
    response={200: SessionDetail, **READ},
    tags=["sessions"],
    summary="A session and its runs",
)
@strict_query(NoParams)
def get_session(request, conversationId: str):  # noqa: N803
    row = None
    if not has_nul(conversationId):
        row = selectors.sessions_matching().filter(conversation_id=conversationId).first()
    if row is None:
        raise Http404(f"conversationId: no session {conversationId!r}")
    item = session_item(row)
    item["runs"] = [run_item(r) for r in selectors.runs_of_session(row["pk"])]
    return item


# --- Leases ------------------------------------------------------------------------------------


class LeaseFilters(Schema):
    runner: str = Field(default=None, description="runnerId (leaseIds are unique per runner)")
    lease_id: str = Field(default=None, description="The runner-scoped leaseId")
    state: LeaseState = None
    parent_run: str = Field(default=None, description="runId of the run that holds it")
    live: QueryBool = Field(default=None, description="Only live (true) or only ended (false)")
    cursor: cursor_param("l") = None
    limit: LimitParam = DEFAULT_LIMIT


def lease_item(row: dict, now) -> dict:
    item = dict(row)
    item["id"] = item["pk"]
    item["live"] = item["state"] == LeaseState.ACTIVE and item["expiresAt"] > now
    if item["parentRunId"] is None:
        item["parentRunId"] = ""
    return item


LEASE_ADDRESSING = (
    "A leaseId is unique only per runner (SPEC §6), so a lease is addressed by its `id`, "
    "the number every lease item carries; find it with `GET /api/leases?runner=R&lease_id=L`."
)


@router.get(
    "/leases",
    response={200: LeasePage, **LIST},
    tags=["leases"],
    summary="List leases, newest first",
    description=LEASE_ADDRESSING,
)
@strict_query(LeaseFilters)
def list_leases(request, filters: Query[LeaseFilters]):
    if has_nul(filters.runner, filters.lease_id, filters.parent_run):
        return {"items": [], "next": None}
    now = timezone.now()
    rows = selectors.leases_matching(
        runner=filters.runner,
        lease_id=filters.lease_id,
        state=filters.state,
        parent_run=filters.parent_run,
        live=filters.live,
        now=now,
    )
    page = keyset_page(rows, "l", filters.cursor, filters.limit)
    page["items"] = [lease_item(row, now) for row in page["items"]]
    return page


def find_lease_row(lease_pk: int) -> dict:
    row = selectors.leases_matching().filter(pk=lease_pk).first()
    if row is None:
        raise Http404(f"id: no lease {lease_pk}")
    return row


@router.get(
    "/leases/{id}",
    response={200: LeaseItem, **READ},
    tags=["leases"],
    summary="A lease",
    description=LEASE_ADDRESSING,
)
@strict_query(NoParams)
def get_lease(request, id: IdParam):  # noqa: A002
    return lease_item(find_lease_row(id), timezone.now())


@router.post(
    "/leases/{id}/release",
    response={200: ReleaseOutcome, **ACT},
    tags=["leases"],
    summary="Release a lease: revoke it and cancel every child under it",
    description="Needs the operator role (a refusal is audited). The same path as "
    "child.lease.release: the lease ends, `lease-released` is recorded on the run that held "
    "it, the runner is told (lease.revoked) and every child under it gets `cancel-requested`. "
    "It waits up to 5 s (LEASE_RELEASE_WAIT_SECONDS) for them to finish: `done` is false if "
    "they are still winding down (`pending` lists them); repeat the call to poll - a repeated "
    "release succeeds. The body's `reason` is audited. " + LEASE_ADDRESSING,
)
@strict_query(NoParams)
def release_lease(request, id: IdParam, body: ReleaseBody = ReleaseBody()):  # noqa: A002, B008
    lease = selectors.get_lease(id)
    if lease is None:
        raise Http404(f"id: no lease {id}")
    return operator.release_lease(actor_for(request), lease, reason=body.reason)


# --- Runners -----------------------------------------------------------------------------------


class RunnerFilters(Schema):
    connected: QueryBool = None
    cursor: cursor_param("n") = None
    limit: LimitParam = DEFAULT_LIMIT


def runner_item(row: dict) -> dict:
    return dict(row)  # ``state`` as the model derives it (``Runner.objects.with_state``)


@router.get(
    "/runners",
    response={200: RunnerPage, **LIST},
    tags=["runners"],
    summary="List runners, oldest first",
)
@strict_query(RunnerFilters)
def list_runners(request, filters: Query[RunnerFilters]):
    rows = selectors.runners_matching(connected=filters.connected)
    page = keyset_page(rows, "n", filters.cursor, filters.limit, descending=False)
    page["items"] = [runner_item(row) for row in page["items"]]
    return page


@router.get(
    "/runners/{runnerId}",
    response={200: RunnerDetail, **READ},
    tags=["runners"],
    summary="A runner, its presets and its runs by status",
)
@strict_query(NoParams)
def get_runner(request, runnerId: str):  # noqa: N803
    row = None if has_nul(runnerId) else selectors.runners_matching(name=runnerId).first()
    if row is None:
        raise Http404(f"runnerId: no runner {runnerId!r}")
    item = runner_item(row)
    item["presets"] = [
        {
            "extensionId": preset.extension_id,
            "generation": preset.generation,
            "name": preset.name,
            "options": preset.options or {},
            "systemPrompt": preset.system_prompt,
        }
        for preset in selectors.presets_of_runner(row["pk"])
    ]
    item["runCounts"] = counts_out(selectors.run_counts_of_runner(row["pk"]))
    return item


# --- Audit -------------------------------------------------------------------------------------


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

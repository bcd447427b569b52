"""Approvals (SPEC §11): the inbox as REST, one decision per approval, run policies. Each
action calls the one approvals service, which checks the role and audits."""

from django.http import Http404
from ninja import Query, Router, Schema
from pydantic import Field

from dashboard.api.core import (
    ACT,
    DEFAULT_LIMIT,
    LIST,
    READ,
    ApiError,
    NoParams,
    actor_for,
    has_nul,
    keyset_page,
    strict_query,
)
from dashboard.api.rows import find_run
from dashboard.api.schemas.approvals import ApprovalOut, ApprovalPage, PolicyOut
from dashboard.api.schemas.common import LimitParam, cursor_param
from delegation.models import ApprovalStatus
from delegation.selectors import approvals as reads
from delegation.services import approvals
from delegation.wire.approvals import DecisionBody, Policy

router = Router(tags=["approvals"])


class ApprovalFilters(Schema):
    status: ApprovalStatus = None
    run: str = Field(default=None, description="runId")
    root: str = Field(default=None, description="runId of a tree's root")
    tool: str = Field(default=None, description="Exact tool name, e.g. Bash")
    cursor: cursor_param("p") = None
    limit: LimitParam = DEFAULT_LIMIT


def _find(approval_id: str):
    approval = None if has_nul(approval_id) else reads.get_approval(approval_id)
    if approval is None:
        raise Http404(f"approvalId: no approval {approval_id!r}")
    return approval


@router.get(
    "/approvals",
    response={200: ApprovalPage, **LIST},
    summary="Approvals, oldest first",
    description="Filter by `status` (pending: the inbox), `run`, `root` and `tool`.",
)
@strict_query(ApprovalFilters)
def list_approvals(request, filters: Query[ApprovalFilters]):
    if has_nul(filters.run, filters.root, filters.tool):
        return {"items": [], "next": None}
    rows = reads.approvals_matching(
        status=filters.status, run_id=filters.run, root_run_id=filters.root, tool=filters.tool
    )
    page = keyset_page(rows.values("pk"), "p", filters.cursor, filters.limit, descending=False)
    by_pk = {a.pk: a for a in rows.filter(pk__in=[i["pk"] for i in page["items"]])}
    page["items"] = [reads.approval_wire(by_pk[i["pk"]]) for i in page["items"]]
    return page


@router.get(
    "/approvals/{approvalId}",
    response={200: ApprovalOut, **READ},
    summary="One approval",
)
@strict_query(NoParams)
def get_approval(request, approvalId: str):  # noqa: N803
    return reads.approval_wire(_find(approvalId))


@router.post(
    "/approvals/{approvalId}/decision",
    response={200: ApprovalOut, **ACT},
    summary="Decide a pending approval",
    description="Needs the operator role (audited). `allow` (optionally with `updatedInput`, "
    "the input as edited) or `deny` (optionally with a `message` the agent is shown); "
    "`scope` `always` also adds an allow rule to the run's policy, or with `scopeRun` "
    "`root` to its tree root's; a `question` or `budget` approval is answered once (422 for "
    "`always`). A second decision changes nothing: 409 naming the first. "
    "An approval with `canEdit: false` came through a door that cannot run an edited input "
    "(an ACP agent answers with an option id only): `updatedInput` on it is 409 "
    "`edit_not_supported_by_door`, and nothing is decided.",
)
@strict_query(NoParams)
def decide(request, approvalId: str, body: DecisionBody):  # noqa: N803
    approval = _find(approvalId)
    try:
        approvals.do_decide_approval(
            actor=actor_for(request),
            approval=approval,
            decision=body.decision,
            message=body.message or "",
            updated_input=body.updated_input,
            scope=body.scope or "once",
            scope_run=body.scope_run or "run",
        )
    except approvals.AlreadyDecided as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    except approvals.EditNotSupported as exc:
        raise ApiError(409, exc.code, str(exc)) from None
    return reads.approval_wire(reads.approval_state(approval.pk))


def _policy_out(run) -> dict:
    chain = reads.policy_chain(run)
    return {"runId": run.run_id, "policy": reads.policy_of(run), "chain": [p for p, _ in chain]}


@router.get(
    "/runs/{runId}/approval-policy",
    response={200: PolicyOut, **READ},
    summary="A run's approval policy",
)
@strict_query(NoParams)
def get_policy(request, runId: str):  # noqa: N803
    return _policy_out(find_run(runId))


@router.put(
    "/runs/{runId}/approval-policy",
    response={200: PolicyOut, **ACT},
    summary="Set a run's approval policy",
    description="Needs the operator role (audited). `{rules, default}`: the first rule whose "
    "`match` (`tool` glob, ACP `kind`, `input` glob on the flattened input) holds decides, "
    "else `default`. The run's effective decision is the strictest of its own policy and "
    "every ancestor's; pending approvals the new policy decides are decided at once.",
)
@strict_query(NoParams)
def put_policy(request, runId: str, body: Policy):  # noqa: N803
    run = find_run(runId)
    approvals.do_set_policy(actor=actor_for(request), run=run, policy=body.plain())
    return _policy_out(find_run(runId))

"""Leases: list, one, and the release action (through the operator service, audited)."""

from django.http import Http404
from django.utils import timezone
from ninja import Query, Router, Schema
from pydantic import Field

from dashboard.api.core import (
    ACT,
    DEFAULT_LIMIT,
    LIST,
    READ,
    NoParams,
    actor_for,
    has_nul,
    keyset_page,
    strict_query,
)
from dashboard.api.schemas.common import IdParam, LimitParam, QueryBool, cursor_param
from dashboard.api.schemas.leases import LeaseItem, LeasePage, ReleaseBody, ReleaseOutcome
from delegation import selectors
from delegation.models import LeaseState
from delegation.services import run_actions

router = Router()


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
    return run_actions.release_lease(actor_for(request), lease, reason=body.reason)

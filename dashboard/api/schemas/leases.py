"""Leases and the release action."""

from __future__ import annotations

import re
from datetime import datetime

from ninja import Schema
from pydantic import Field, field_validator

from dashboard.api.schemas.common import NO_NUL
from delegation.models import LeaseState
from delegation.wire import Strict


def _no_nul(value: str) -> str:
    if not re.search(NO_NUL, value):
        raise ValueError("must not contain NUL")
    return value


class ReleaseBody(Strict):
    """Release a lease; the body may be omitted or `{}`."""

    reason: str = Field(
        default="", max_length=2000, description="Why; recorded in the audit log.",
        json_schema_extra={"pattern": NO_NUL},
    )  # fmt: skip
    _reason = field_validator("reason")(_no_nul)


class ReleaseOutcome(Schema):
    done: bool = Field(description="true once no child under the lease is still running")
    pending: list[str] = Field(description="runIds still winding down (cancel requested)")
    state: LeaseState


class LeaseItem(Schema):
    id: int = Field(description="Address of the lease: /api/leases/{id}")
    leaseId: str = Field(description="The runner-scoped leaseId (unique per runner)")
    runnerId: str
    extensionId: str
    generation: int
    parentRunId: str
    state: LeaseState
    live: bool = Field(description="active and not yet past expiresAt")
    childCount: int = Field(description="Runs started under this lease")
    liveChildCount: int = Field(description="Of those, still running")
    createdAt: datetime
    expiresAt: datetime
    endedAt: datetime | None


class LeasePage(Schema):
    items: list[LeaseItem]
    next: str | None

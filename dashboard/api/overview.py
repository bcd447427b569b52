"""The overview's headline numbers: what the trees page shows above its table."""

from datetime import datetime

from ninja import Router, Schema
from pydantic import Field

from dashboard.api.core import READ, NoParams, strict_query
from delegation import selectors

router = Router()


class HourCost(Schema):
    hourStart: datetime  # noqa: N815
    costUsd: float = Field(description="Own cost of the runs that started in this hour")  # noqa: N815


class OverviewOut(Schema):
    liveRuns: int = Field(description="Runs running now, at any depth")  # noqa: N815
    liveRoots: int = Field(description="Top-level runs running now")  # noqa: N815
    failedLastHour: int = Field(description="Runs failed or lost in the last hour")  # noqa: N815
    failedLastDay: int = Field(description="Runs failed or lost in the last 24 hours")  # noqa: N815
    pendingApprovals: int = Field(  # noqa: N815
        description="Approvals waiting for a decision (as GET /api/approvals?status=pending)"
    )
    costLastHourUsd: float = Field(  # noqa: N815
        description="Cost of the runs started in the last hour"
    )
    costLastDayUsd: float = Field(description="Cost of the runs started in the last 24 hours")  # noqa: N815
    runsByStatus: dict[str, int]  # noqa: N815
    costByHour: list[HourCost] = Field(description="The last 24 hours, oldest first")  # noqa: N815
    at: datetime


@router.get(
    "/overview",
    response={200: OverviewOut, **READ},
    summary="Headline numbers: live runs, failures and cost in the last hour and day",
)
@strict_query(NoParams)
def get_overview(request):
    return selectors.overview_numbers()

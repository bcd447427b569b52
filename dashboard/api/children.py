"""A run's children (issue 24): ``GET /api/runs/{runId}/children?status=``, for scripts that
fan out and join. Each item is a run row with its output and whole conclusion, so one read
tells a script which children finished and what each achieved."""

from django.utils import timezone
from ninja import Query, Schema
from pydantic import Field

from dashboard.api.core import DEFAULT_LIMIT, READ, keyset_page, strict_query
from dashboard.api.rows import find_run, run_item
from dashboard.api.runs import router
from dashboard.api.schemas.children import ChildPage
from dashboard.api.schemas.common import LimitParam, cursor_param
from delegation import selectors
from delegation.models import RunStatus


class ChildFilters(Schema):
    status: list[RunStatus] = Field(
        default=None, description="Repeat for several: ?status=succeeded&status=failed"
    )
    cursor: cursor_param("r") = None
    limit: LimitParam = DEFAULT_LIMIT


@router.get(
    "/runs/{runId}/children",
    response={200: ChildPage, **READ},
    summary="A run's direct children, newest first, with their output and conclusion",
    description="The children a run started (every run of theirs, after a resume too), "
    "filtered by `status`; keyset-paginated like `/api/runs`. 404 for an unknown run.",
)
@strict_query(ChildFilters, lists=("status",))
def list_children(request, runId: str, filters: Query[ChildFilters]):  # noqa: N803
    parent = find_run(runId)
    runs = selectors.runs_matching(statuses=filters.status, parent=parent.run_id)
    rows = selectors.run_rows(runs, "output", "conclusion")
    page = keyset_page(rows, "r", filters.cursor, filters.limit)
    now = timezone.now()
    items = []
    for row in page["items"]:
        output, conclusion = row.pop("output"), row.pop("conclusion")
        items.append({**run_item(row, now), "output": output, "conclusion": conclusion})
    page["items"] = items
    return page

"""Runners: list, and one with its presets and its runs by status."""

from django.http import Http404
from ninja import Query, Router, Schema

from dashboard.api.core import (
    DEFAULT_LIMIT,
    LIST,
    READ,
    NoParams,
    has_nul,
    keyset_page,
    strict_query,
)
from dashboard.api.rows import counts_out
from dashboard.api.schemas.common import LimitParam, QueryBool, cursor_param
from dashboard.api.schemas.runners import RunnerDetail, RunnerPage
from delegation import selectors

router = Router()


class RunnerFilters(Schema):
    connected: QueryBool = None
    cursor: cursor_param("n") = None
    limit: LimitParam = DEFAULT_LIMIT


def runner_item(row: dict) -> dict:
    return dict(row)  # ``state`` as the model derives it (the runner manager's ``with_state``)


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

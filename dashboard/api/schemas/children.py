"""A run's children as ``GET /api/runs/{runId}/children`` lists them (issue 24)."""

from __future__ import annotations

from ninja import Schema
from pydantic import Field

from dashboard.api.schemas.conclusions import ConclusionOut
from dashboard.api.schemas.runs import RunItem


class ChildItem(RunItem):
    """A child as ``GET /api/runs/{runId}/children`` lists it: a run row with its output and
    its whole conclusion, so a script joins its children with one read."""

    output: str
    conclusion: ConclusionOut | None = Field(description="null until the child concludes")


class ChildPage(Schema):
    items: list[ChildItem]
    next: str | None = Field(description="Cursor of the next page, null on the last page")

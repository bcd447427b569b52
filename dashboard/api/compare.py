"""Compare two runs: their streams aligned by step, and the deltas (issue 25)."""

from ninja import Router, Schema
from pydantic import Field

from dashboard.api.core import READ, NoParams, strict_query
from dashboard.api.rows import find_run
from delegation import selectors

router = Router()


class CompareSide(Schema):
    runId: str  # noqa: N815
    task: str
    profile: str
    status: str
    error: str
    tokens: int
    costUsd: float  # noqa: N815
    durationSeconds: float | None  # noqa: N815


class CompareStep(Schema):
    sequence: int
    kind: str
    toolName: str  # noqa: N815
    text: str


class AlignedStep(Schema):
    a: CompareStep | None
    b: CompareStep | None
    change: str = Field(description="same, changed, only-a or only-b")


class CompareDeltas(Schema):
    tokens: int = Field(description="b minus a, the runs' own tokens")
    costUsd: float  # noqa: N815
    durationSeconds: float | None  # noqa: N815
    outcome: str = Field(description='"same", or "<a status> → <b status>"')


class CompareOut(Schema):
    a: CompareSide
    b: CompareSide
    deltas: CompareDeltas
    steps: list[AlignedStep] = Field(
        description="Tool calls matched by name and order, texts and results beside them"
    )
    differences: int = Field(description="Aligned steps that are not the same")


@router.get(
    "/runs/{runId}/compare/{otherRunId}",
    response={200: CompareOut, **READ},
    summary="Compare two runs: streams aligned by step, deltas in tokens, cost, time, outcome",
)
@strict_query(NoParams)
def compare_runs(request, runId: str, otherRunId: str):  # noqa: N803
    return selectors.compare_runs(find_run(runId), find_run(otherRunId))

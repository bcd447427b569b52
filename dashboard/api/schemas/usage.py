"""Usage rollups and budgets of a run's subtree (SPEC §10), as the API shows and sets them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import BeforeValidator, Field, field_validator

from dashboard.api.schemas.common import NO_NUL, RunCountsOut, no_nul
from delegation.wire import BudgetLimits, Strict


class OwnUsage(Schema):
    """What the run's own usage events reported (SPEC §10)."""

    inputTokens: int
    outputTokens: int
    cacheReadTokens: int
    cacheWriteTokens: int
    costUsd: float
    usageEvents: int
    unpricedEvents: int = Field(
        description="Usage events with tokens but no cost and no price for their model "
        "(costUsd leaves them out: the cost is incomplete, not $0)"
    )


class SubtreeUsage(Schema):
    """The run and every run below it, kept current as rows commit (never a scan)."""

    inputTokens: int
    outputTokens: int
    cacheReadTokens: int
    cacheWriteTokens: int
    costUsd: float
    unpricedEvents: int = Field(
        description="Usage events with tokens but no cost and no price for their model "
        "(costUsd leaves them out: the cost is incomplete, not $0)"
    )
    runs: RunCountsOut = Field(description="Runs of the subtree (itself included) by status")
    live: int = Field(description="Runs of the subtree still running")
    wallSeconds: float = Field(
        description="From the run's start to its subtree's last end (to now while any is live)"
    )


class Usage(Schema):
    own: OwnUsage
    subtree: SubtreeUsage


class BudgetLimitOut(Schema):
    # int first: a count limit (maxRuns: 40) must come back 40, not 40.0.
    limit: int | float = Field(description="An integer for counts, tokens and seconds")
    used: int | float = Field(description="What the subtree has used of it (descendants for runs)")
    fraction: float


class BudgetOut(Schema):
    """A budget on the run's subtree: only the limits it sets appear in `limits`."""

    limits: dict[str, BudgetLimitOut] = Field(
        description="By name: maxRuns, maxLive, maxTokens, maxCostUsd, maxSeconds"
    )
    costUnbounded: str = Field(
        default="",
        description='Why maxCostUsd cannot bound the cost ("" when it can): some usage of '
        "the subtree has no cost and no price for its model",
    )
    setBy: str
    warnedAt: datetime | None
    exceededAt: datetime | None
    exceededReason: str = Field(description='Why the subtree was stopped, "" if it was not')
    onLimit: Literal["cancel", "pause"] = Field(
        default="cancel",
        description='SPEC §14: what happens at a limit: "cancel" the subtree or "pause" it and '
        "ask in the approvals inbox",
    )


def _integral(value: Any) -> Any:
    # JSON Schema's "integer" admits 5.0; anything fractional (or a bool) still fails.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# The bounds of delegation.wire.BudgetLimits, which the service takes.
BodyCount = Annotated[int, Field(ge=0, le=10**15), BeforeValidator(_integral)]


class BudgetLimitsBody(Strict):
    """Limits on a run's subtree (SPEC §10); an omitted limit is unbounded."""

    max_runs: BodyCount = Field(default=None, alias="maxRuns")
    max_live: BodyCount = Field(default=None, alias="maxLive")
    max_tokens: BodyCount = Field(default=None, alias="maxTokens")
    max_cost_usd: float = Field(default=None, ge=0, le=1e9, allow_inf_nan=False, alias="maxCostUsd")
    max_seconds: Annotated[int, Field(ge=1, le=10**12), BeforeValidator(_integral)] = Field(
        default=None, alias="maxSeconds"
    )
    on_limit: Literal["cancel", "pause"] = Field(
        default=None,
        alias="onLimit",
        description='SPEC §14: at a limit, "cancel" the subtree (the default) or "pause" it '
        "and ask in the approvals inbox (an approval of kind budget)",
    )

    def limits(self) -> BudgetLimits:
        """The wire budget the services take."""
        return BudgetLimits.model_validate(
            self.model_dump(by_alias=True, exclude_unset=True, exclude={"reason"})
        )


class BudgetBody(BudgetLimitsBody):
    """Limits on the run's subtree (SPEC §10). PUT sets exactly these (an omitted limit is
    removed); PATCH changes only those given. Needs the operator role; audited."""

    reason: str = Field(
        default="",
        max_length=2000,
        description="Recorded in the audit log",
        json_schema_extra={"pattern": NO_NUL},
    )

    _reason = field_validator("reason")(no_nul)


class TreeOwnUsage(Schema):
    inputTokens: int
    outputTokens: int
    costUsd: float


class TreeSubtreeUsage(Schema):
    inputTokens: int
    outputTokens: int
    costUsd: float
    unpricedEvents: int = Field(description="Usage events of the subtree without a price")
    runs: int = Field(description="Runs of the subtree, itself included")
    live: int


class TreeUsage(Schema):
    """A node's share of the rollups, compact (the run's detail has them all)."""

    own: TreeOwnUsage
    subtree: TreeSubtreeUsage


class TreeBudget(Schema):
    limits: dict[str, int | float] = Field(description="The limits set, by name")
    exceededReason: str = Field(description='Why the subtree was stopped, "" if it was not')

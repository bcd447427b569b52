"""Runs: lists, detail, the subtree, events, steer receipts, and the bodies and reports of
launch, cancel and steer."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from ninja import Schema
from pydantic import Field, create_model, field_validator

from dashboard.api.schemas.common import (
    NO_NUL,
    NOT_BLANK_NO_NUL,
    REQUEST_ID,
    ChildCounts,
    no_nul,
    not_blank_no_nul,
)
from dashboard.api.schemas.conclusions import ConclusionOut
from dashboard.api.schemas.usage import BudgetLimitsBody, BudgetOut, TreeBudget, TreeUsage, Usage
from delegation.models import LeaseState, RunStatus
from delegation.protocol import MAX_STEER_BYTES
from delegation.wire import MAX_MESSAGE_BYTES, RESULT_KEYS, Result, Strict, utf8_len
from delegation.wire.approvals import Policy


class RelaunchBody(Strict):
    """Start the run again: a new top-level run with its runner, preset, working directory
    and budget, linked to it (`relaunchedFrom`)."""

    message: str = Field(
        default=None,
        min_length=1,
        max_length=MAX_MESSAGE_BYTES,
        description="The task; omit it to run the original's message again.",
        json_schema_extra={"pattern": NOT_BLANK_NO_NUL},
    )


class CancelBody(Strict):
    """Cancel a run; with `cascade`, also every live run below it."""

    reason: str = Field(
        default="",
        max_length=2000,
        description="Why; recorded on the `cancel-requested` event and in the audit log.",
        json_schema_extra={"pattern": NO_NUL},
    )
    cascade: bool = Field(
        default=False, description="Also cancel every non-terminal descendant, reporting each."
    )

    _reason = field_validator("reason")(no_nul)


class SteerBody(Strict):
    """Queue a message for a running run (idempotent per child session by `requestId`)."""

    request_id: str = Field(
        alias="requestId",
        min_length=1,
        max_length=128,
        description="Idempotency key: printable ASCII without `/` or `\\`, not `.` or `..`, "
        "at most 128 characters. The same requestId with the same message answers the stored "
        "outcome; with another message it is refused (409, rpcCode −32013).",
        json_schema_extra={"pattern": REQUEST_ID, "not": {"enum": [".", ".."]}},
    )
    message: str = Field(
        min_length=1,
        max_length=MAX_STEER_BYTES,
        description=f"Non-blank, at most {MAX_STEER_BYTES} bytes of UTF-8 (a longer encoding "
        "is refused with 422), no NUL.",
        json_schema_extra={"pattern": NOT_BLANK_NO_NUL},
    )

    @field_validator("request_id")
    @classmethod
    def _request_id(cls, value: str) -> str:
        if not re.search(REQUEST_ID, value) or value in (".", ".."):
            raise ValueError("must be printable ASCII without '/' or '\\', and not '.' or '..'")
        return value

    @field_validator("message")
    @classmethod
    def _message(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("must not contain NUL")
        if not re.search(NOT_BLANK_NO_NUL, value):
            raise ValueError("must not be blank")
        if utf8_len(value) > MAX_STEER_BYTES:
            raise ValueError(f"must be at most {MAX_STEER_BYTES} bytes of UTF-8")
        return value


class LaunchBody(Strict):
    """Start a top-level run on a connected runner with one of its presets (SPEC §9)."""

    runner: str = Field(
        min_length=1,
        max_length=128,
        description="The runner's name (runnerId); it must be connected.",
        json_schema_extra={"pattern": NOT_BLANK_NO_NUL},
    )
    profile: str = Field(
        min_length=1,
        max_length=128,
        description="A preset the runner registered.",
        json_schema_extra={"pattern": NOT_BLANK_NO_NUL},
    )
    message: str = Field(
        min_length=1,
        max_length=MAX_MESSAGE_BYTES,
        description="The task, non-blank, at most 512 KiB of UTF-8.",
        json_schema_extra={"pattern": NOT_BLANK_NO_NUL},
    )
    extension_id: str = Field(
        default=None,
        alias="extensionId",
        min_length=1,
        max_length=128,
        description="The extension offering the preset; needed only when several offer it.",
        json_schema_extra={"pattern": NOT_BLANK_NO_NUL},
    )
    cwd: str = Field(
        default=None,
        min_length=1,
        max_length=8192,
        description="Working directory, confined to the runner's workspace when it has one.",
        json_schema_extra={"pattern": NOT_BLANK_NO_NUL},
    )

    budget: BudgetLimitsBody = Field(
        default=None,
        description="Limits on the launched run's whole tree (SPEC §10): maxRuns, maxLive, "
        "maxTokens, maxCostUsd, maxSeconds; an omitted limit is unbounded.",
    )
    approvals: Policy = Field(
        default=None,
        description="The run's approval policy (SPEC §11) `{rules, default}`; it also weighs "
        "on every run below it (strictest wins).",
    )

    _checks = field_validator("runner", "profile", "message", "extension_id", "cwd")(
        classmethod(lambda cls, value: not_blank_no_nul(value))
    )


class ForkLink(Schema):
    runId: str
    sequence: int | None


class RunItem(Schema):
    """A run as lists and trees show it (no output, no events)."""

    runId: str
    conversationId: str
    parentRunId: str = Field(description='"" for a top-level run')
    parentConversationId: str
    rootRunId: str = Field(description="The top-level run of its tree (itself when top-level)")
    runnerId: str
    hostInstanceId: str
    extensionId: str
    profile: str
    depth: int
    status: RunStatus
    done: bool
    cancelled: bool
    error: str
    leaseId: str = Field(description='The lease it was started under, "" if none')
    lastSequence: int = Field(description="Head of its event stream (= number of events)")
    refusedSpawns: int
    via: str = Field(
        description="How the run was started: runner (run.open / child.start), mcp (an agent's "
        "delegate tool call) or launch (an operator)"
    )
    cancelRequestedAt: datetime | None
    createdAt: datetime
    updatedAt: datetime
    finishedAt: datetime | None
    usage: Usage
    budget: BudgetOut | None = Field(description="null when the run has no budget")
    task: str = Field(description='First line of the request message ("" if none)')
    activity: str = Field(description="Its latest text or tool call, as the tree shows it")
    conclusionStatus: str | None = Field(
        default=None,
        description="The status of its conclusion (done, partial, blocked, failed); null "
        "until it concludes",
    )


class RunPage(Schema):
    items: list[RunItem]
    next: str | None = Field(description="Cursor of the next page, null on the last page")


class EventOut(Schema):
    """One event of a run's stream; absent fields are omitted, never null."""

    sequence: int
    kind: str
    text: str = None
    toolName: str = None
    toolCallId: str = None
    input: Any = None
    toolOutput: Any = None
    success: bool = None
    error: str = None


class EventPage(Schema):
    items: list[EventOut]
    next: str | None
    lastSequence: int = Field(description="The run's head sequence when this page was read")


class LeaseRef(Schema):
    id: int = Field(description="Address of the lease in /api/leases/{id}")
    leaseId: str
    runnerId: str
    state: LeaseState
    live: bool
    expiresAt: datetime


_CONCLUSION = (
    ConclusionOut | None,
    Field(
        description="SPEC §9 Conclusions: what the run says it achieved; null until it concludes"
    ),
)


def result_schema(name: str, doc: str | None, **narrowed) -> type[Schema]:
    """SPEC §6 ``Result`` as a REST schema, built from the wire's ``Result`` (its keys in
    ``RESULT_KEYS`` order, every one required): the one place its fields are written is
    ``delegation.wire``. ``narrowed`` gives a key a tighter type for the OpenAPI document
    (the status enum, the event shape, the conclusion's schema), as ``(type, Field)``."""
    by_key = {info.alias or attr: info for attr, info in Result.model_fields.items()}
    fields = {key: narrowed.pop(key, (by_key[key].annotation, ...)) for key in RESULT_KEYS}
    if narrowed:
        raise TypeError(f"not Result keys: {sorted(narrowed)}")
    return create_model(name, __base__=Schema, __doc__=doc, __module__=__name__, **fields)


RunResult = result_schema(
    "RunResult",
    "SPEC §6 ``Result``: every field always present.",
    events=(list[EventOut], ...),
    status=(RunStatus, ...),
    conclusion=_CONCLUSION,
)


class RunDetail(
    result_schema(
        "RunDetailResult",
        None,
        events=(
            list[EventOut],
            Field(description="Always []: read events from /api/runs/{runId}/events (paged)"),
        ),
        status=(RunStatus, ...),
        conclusion=_CONCLUSION,
    )
):
    """The SPEC §6 `Result` (every field present) plus what an operator needs around it."""

    task: str = Field(
        description='The run\'s task: first line of its request message, as lists show it ("" if none)'
    )
    rootRunId: str
    childCounts: ChildCounts
    lease: LeaseRef | None = Field(description="The lease this run was started under")
    lastSequence: int
    refusedSpawns: int
    via: str = Field(
        description="How the run was started: runner (run.open / child.start), mcp (an agent's "
        "delegate tool call) or launch (an operator)"
    )
    cancelRequestedAt: datetime | None
    cancelReason: str
    agentSessionId: str = Field(
        description="SPEC §14: the agent's own session id (Claude Code's session_id), what a "
        "fork of this run resumes; empty until the agent reports one"
    )
    pausedAt: datetime | None = Field(
        description="SPEC §14: when the run was paused (null when not paused)"
    )
    pauseReason: str = Field(description="Why the current or last pause was asked for")
    pausedSeconds: float = Field(
        description="Time spent paused (every pause, the current one included); it does not "
        "count toward maxSeconds"
    )
    relaunchedFrom: str | None = Field(  # noqa: N815
        description="The runId this run was relaunched from (null when it was not)"
    )
    relaunches: list[str] = Field(description="The runIds relaunched from this run, oldest first")
    forkedFrom: ForkLink | None = Field(  # noqa: N815
        description="SPEC §14: the run (and step; null = its end) this run was forked from"
    )
    forks: list[ForkLink] = Field(description="The runs forked from this run, oldest first")
    createdAt: datetime
    updatedAt: datetime
    finishedAt: datetime | None
    usage: Usage
    budget: BudgetOut | None = Field(description="null when the run has no budget")


class TreeNode(RunItem):
    usage: TreeUsage = Field(default=None, description="With `usage=true` only")
    budget: TreeBudget | None = Field(default=None, description="With `usage=true` only")
    childCounts: ChildCounts = Field(description="Children by status (all of them)")
    childrenIncluded: bool = Field(
        description="false on the depth boundary: children exist beyond `levels`"
    )
    children: list[TreeNode]


TreeNode.model_rebuild()


class CancelledDescendant(Schema):
    runId: str
    depth: int
    outcome: str = Field(description="requested | already-requested | already-finished")


class PauseBody(Strict):
    """Pause or resume a run (SPEC §14); with `subtree`, every live run below it too."""

    subtree: bool = Field(
        default=False, description="Also every live run below it, reporting each."
    )
    reason: str = Field(
        default="",
        max_length=2000,
        description="Why; recorded on the `paused` event and in the audit log.",
        json_schema_extra={"pattern": NO_NUL},
    )


class PausedRun(Schema):
    runId: str
    depth: int
    outcome: str = Field(
        description="pause: paused | already-paused | cancel-requested | already-finished; "
        "resume: resumed | not-paused | already-finished"
    )


class PauseReport(Schema):
    runId: str
    outcome: str = Field(description="As for each descendant")
    descendants: list[PausedRun]


class CancelReport(Schema):
    runId: str
    outcome: str = Field(description="requested | already-requested | already-finished")
    descendants: list[CancelledDescendant]


class SteerOutcome(Schema):
    outcome: str = Field(description="injected | promptRequired")
    reason: str = Field(default=None, description="With promptRequired: noRunningTurn")


class SteerReceiptOut(Schema):
    requestId: str
    message: str
    actor: str
    createdAt: datetime
    outcome: str = Field(description="The answer the steer got: injected | promptRequired")
    reason: str = Field(description="With promptRequired: noRunningTurn; else empty")
    delivery: str = Field(
        description="delivered (the runner answered run.steer with injected), queued "
        "(injected, the runner has not answered yet), undelivered (the runner answered "
        "run.steer with something else, e.g. promptRequired), or not-sent"
    )
    runnerOutcome: str = Field(description="With undelivered: the runner's outcome")
    runnerReason: str = Field(description="With undelivered: the runner's reason")
    undeliveredAt: datetime | None


class SteerReceiptList(Schema):
    items: list[SteerReceiptOut]

"""Request and response shapes of the REST API, as the OpenAPI document publishes them.

Request bodies subclass the engine's ``Strict`` base (unknown fields, ``null`` and wrong types
are refused, never coerced). Query parameters are parsed just as exactly: an integer is
decimal digits, a boolean is ``true`` or ``false``, a time is RFC 3339 with an offset; what
the document says is accepted is exactly what the server accepts, so schemathesis can hold
the two to each other. Response models name their fields in the wire's camelCase.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from ninja import Schema
from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator

from delegation.models import LeaseState, RunStatus
from delegation.protocol import MAX_STEER_BYTES
from delegation.wire import MAX_MESSAGE_BYTES, BudgetLimits, Strict, utf8_len

BIGINT_MAX = 2**63 - 1

# --- Exact query-parameter types -------------------------------------------------------------

_DIGITS = re.compile(r"-?[0-9]+")
_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"
)


def _query_int(value: Any) -> Any:
    if isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            raise ValueError("must be a decimal integer")
        return int(value)
    return value


def _query_bool(value: Any) -> Any:
    if isinstance(value, str):
        if value not in ("true", "false"):
            raise ValueError("must be true or false")
        return value == "true"
    return value


def _query_time(value: Any) -> Any:
    """RFC 3339 with an offset, as JSON Schema's date-time; read and clamped in UTC."""
    if not isinstance(value, str):
        return value
    match = _RFC3339.fullmatch(value)
    if not match:
        raise ValueError("must be an RFC 3339 date-time with an offset, e.g. 2025-01-31T12:00:00Z")
    day, hour, minute, second, fraction, offset = match.groups()
    if second == "60":  # a leap second: the instant just before the next minute
        second, fraction = "59", ".999999"
    fraction = (fraction or "")[:7]
    offset = "+00:00" if offset in ("Z", "z") else offset
    try:
        parsed = datetime.fromisoformat(f"{day}T{hour}:{minute}:{second}{fraction}{offset}")
    except ValueError as exc:
        raise ValueError(f"not a valid date-time: {exc}") from None
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        # Past the ends of what a datetime can hold in UTC: the filter then holds everywhere.
        return (
            datetime.max.replace(tzinfo=UTC)
            if parsed.year > 1
            else datetime.min.replace(tzinfo=UTC)
        )


QueryBool = Annotated[bool, BeforeValidator(_query_bool)]
QueryTime = Annotated[
    datetime,
    BeforeValidator(_query_time),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]

# Constraints go before the parsing validator so they land on the integer schema itself
# (JSON Schema minimum/maximum) rather than on the wrapper.
DepthParam = Annotated[int, Field(ge=0, le=BIGINT_MAX), BeforeValidator(_query_int)]
SequenceParam = DepthParam
IdParam = Annotated[int, Field(ge=1, le=BIGINT_MAX), BeforeValidator(_query_int)]
LimitParam = Annotated[
    int,
    Field(ge=1, le=1000, description="Page size, 1 to 1000 (default 100)."),
    BeforeValidator(_query_int),
]


def cursor_param(prefix: str):
    return Annotated[
        str,
        Field(
            pattern=rf"^{prefix}[0-9a-f]{{1,16}}$",
            description="Opaque position from a previous page's `next`; pass it back unchanged.",
        ),
    ]


# --- Bodies (strict) -------------------------------------------------------------------------

# JSON Schema patterns, checked server-side with Python's `re` exactly as published.
NO_NUL = r"^[^\x00]*$"
NOT_BLANK_NO_NUL = r"^[^\x00]*[^\x00\s][^\x00]*$"
# A REST requestId: a SPEC ValidID restricted to printable ASCII, so that 128 characters are
# 128 bytes and the published maxLength is exact.
REQUEST_ID = r"^[!-.0-\[\]-~]+$"


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

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        if not re.search(NO_NUL, value):
            raise ValueError("must not contain NUL")
        return value


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


def _not_blank_no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL")
    if not value.strip():
        raise ValueError("must not be blank")
    return value


# --- Responses ---------------------------------------------------------------------------------


class ChildCounts(Schema):
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    lost: int = 0
    total: int = 0


class RunCountsOut(ChildCounts):
    pass


class OwnUsage(Schema):
    """What the run's own usage events reported (SPEC §10)."""

    inputTokens: int
    outputTokens: int
    cacheReadTokens: int
    cacheWriteTokens: int
    costUsd: float
    usageEvents: int


class SubtreeUsage(Schema):
    """The run and every run below it, kept current as rows commit (never a scan)."""

    inputTokens: int
    outputTokens: int
    cacheReadTokens: int
    cacheWriteTokens: int
    costUsd: float
    runs: RunCountsOut = Field(description="Runs of the subtree (itself included) by status")
    live: int = Field(description="Runs of the subtree still running")
    wallSeconds: float = Field(
        description="From the run's start to its subtree's last end (to now while any is live)"
    )


class Usage(Schema):
    own: OwnUsage
    subtree: SubtreeUsage


class BudgetLimitOut(Schema):
    limit: float
    used: float = Field(description="What the subtree has used of it (descendants for runs)")
    fraction: float


class BudgetOut(Schema):
    """A budget on the run's subtree: only the limits it sets appear in `limits`."""

    limits: dict[str, BudgetLimitOut] = Field(
        description="By name: maxRuns, maxLive, maxTokens, maxCostUsd, maxSeconds"
    )
    setBy: str
    warnedAt: datetime | None
    exceededAt: datetime | None
    exceededReason: str = Field(description='Why the subtree was stopped, "" if it was not')


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

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        if not re.search(NO_NUL, value):
            raise ValueError("must not contain NUL")
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

    _checks = field_validator("runner", "profile", "message", "extension_id", "cwd")(
        classmethod(lambda cls, value: _not_blank_no_nul(value))
    )


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


class RunResult(Schema):
    """SPEC §6 ``Result``: every field always present."""

    runnerId: str
    hostInstanceId: str
    conversationId: str
    runId: str
    parentConversationId: str
    parentRunId: str
    extensionId: str
    profile: str
    done: bool
    cancelled: bool
    error: str
    output: str
    events: list[EventOut]
    depth: int
    status: RunStatus


class RunDetail(Schema):
    """The SPEC §6 `Result` (every field present) plus what an operator needs around it."""

    runnerId: str
    hostInstanceId: str
    conversationId: str
    runId: str
    parentConversationId: str
    parentRunId: str
    extensionId: str
    profile: str
    done: bool
    cancelled: bool
    error: str
    output: str
    events: list[EventOut] = Field(
        description="Always []: read events from /api/runs/{runId}/events (paged)"
    )
    depth: int
    status: RunStatus
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
    createdAt: datetime
    updatedAt: datetime
    finishedAt: datetime | None
    usage: Usage
    budget: BudgetOut | None = Field(description="null when the run has no budget")


class TreeOwnUsage(Schema):
    inputTokens: int
    outputTokens: int
    costUsd: float


class TreeSubtreeUsage(Schema):
    inputTokens: int
    outputTokens: int
    costUsd: float
    runs: int = Field(description="Runs of the subtree, itself included")
    live: int


class TreeUsage(Schema):
    """A node's share of the rollups, compact (the run's detail has them all)."""

    own: TreeOwnUsage
    subtree: TreeSubtreeUsage


class TreeBudget(Schema):
    limits: dict[str, float] = Field(description="The limits set, by name")
    exceededReason: str = Field(description='Why the subtree was stopped, "" if it was not')


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
        description="queued (injected, the runner has not refused it), undelivered (the "
        "runner answered run.steer with something else, e.g. promptRequired), or not-sent"
    )
    runnerOutcome: str = Field(description="With undelivered: the runner's outcome")
    runnerReason: str = Field(description="With undelivered: the runner's reason")
    undeliveredAt: datetime | None


class SteerReceiptList(Schema):
    items: list[SteerReceiptOut]


class ReleaseOutcome(Schema):
    done: bool = Field(description="true once no child under the lease is still running")
    pending: list[str] = Field(description="runIds still winding down (cancel requested)")
    state: LeaseState


class SessionItem(Schema):
    conversationId: str
    runnerId: str
    depth: int
    parentConversationId: str
    extensionId: str
    profile: str
    hostInstanceId: str
    createdAt: datetime


class SessionPage(Schema):
    items: list[SessionItem]
    next: str | None


class SessionDetail(SessionItem):
    runs: list[RunItem] = Field(description="Its runs, oldest first (a resume adds one)")


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


class RunnerItem(Schema):
    runnerId: str
    state: str = Field(description="connected | disconnected | lost | revoked")
    connected: bool
    connectionGeneration: int
    hostInstanceId: str
    workspace: str
    declaredDepth: int | None
    createdAt: datetime
    revokedAt: datetime | None
    lastSeenAt: datetime | None
    disconnectedAt: datetime | None
    lostAt: datetime | None


class RunnerPage(Schema):
    items: list[RunnerItem]
    next: str | None


class PresetOut(Schema):
    extensionId: str
    generation: int
    name: str
    options: dict[str, Any]
    systemPrompt: str


class RunnerDetail(RunnerItem):
    presets: list[PresetOut]
    runCounts: ChildCounts = Field(description="Its runs by status")


class AuditItem(Schema):
    id: int
    actor: str = Field(description='"user:alice", "runner:ci-1" or "system:..."')
    user: str = Field(description='Username behind the actor, "" if none')
    via: str
    action: str
    targetType: str
    targetId: str
    reason: str
    outcome: str
    detail: dict[str, Any]
    createdAt: datetime


class AuditPage(Schema):
    items: list[AuditItem]
    next: str | None

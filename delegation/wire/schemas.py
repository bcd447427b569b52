"""Strict wire schemas: the one vocabulary for runner frames, live frames and REST bodies.

Unknown fields refused at every level, exact camelCase names, no coercion, and no ``null``
where the SPEC forbids it (SPEC §4). Unknown fields being refused is what keeps requests
credential-free: an ``apiKey`` or ``systemPromptPath`` simply has nowhere to go. The bytes
are decoded first by ``delegation.wire.decode``.
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from delegation.errors import INVALID_PARAMS, RpcError
from delegation.protocol import KIB
from delegation.wire.decode import utf8_len

MAX_ID_BYTES = 128
MAX_MESSAGE_BYTES = 512 * KIB
MAX_SYSTEM_PROMPT_BYTES = 256 * KIB
MAX_CWD_BYTES = 8 * KIB
MAX_PRESETS_PER_EXTENSION = 32
MAX_EVENT_FIELD_BYTES = 32 * KIB
MAX_KIND_BYTES = 64

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


# --- Field rules --------------------------------------------------------------------------


def valid_id(value: str, field: str = "") -> str:
    """ValidID: an opaque identifier that can never be used as a path."""
    what = f"{field} " if field else ""
    if value == "":
        raise ValueError(f"{what}must not be empty")
    if value in (".", ".."):
        raise ValueError(f"{what}must not be '.' or '..'")
    if utf8_len(value) > MAX_ID_BYTES:
        raise ValueError(f"{what}must be at most {MAX_ID_BYTES} bytes of UTF-8")
    for ch in value:
        if ch in "/\\":
            raise ValueError(f"{what}must not contain '/' or '\\'")
        if ord(ch) <= 0x20 or ord(ch) == 0x7F:
            raise ValueError(f"{what}must not contain whitespace or control characters")
    return value


BIGINT_MAX = 2**63 - 1


def positive_generation(value: int) -> int:
    if value <= 0:
        raise ValueError("must be a positive integer (0 is never a generation)")
    # Stored in a bigint column: a larger value would reach the database and fail there.
    if value > BIGINT_MAX:
        raise ValueError(f"must be at most {BIGINT_MAX} (2^63-1)")
    return value


def _not_blank(value: str, what: str = "value") -> str:
    if value.strip() == "":
        raise ValueError(f"{what} must not be blank")
    return value


def _max_bytes(value: str, limit: int, what: str = "value") -> str:
    if utf8_len(value) > limit:
        raise ValueError(f"{what} must be at most {limit} bytes of UTF-8")
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def wire(self) -> dict:
        return self.model_dump(by_alias=True, exclude_unset=True)


# The field's name comes from the error's location, so the rules' messages leave it out.
ValidId = Annotated[str, AfterValidator(valid_id)]
Generation = Annotated[int, AfterValidator(positive_generation)]
NonNegative = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(gt=0)]


class Options(Strict):
    """Execution options; every member optional, omission inherits."""

    model: str = Field(default=None)
    weak_model: str = Field(default=None, alias="weakModel")
    max_tokens: Positive = Field(default=None, alias="maxTokens")
    weak_model_max_tokens: Positive = Field(default=None, alias="weakModelMaxTokens")
    thinking_budget_tokens: NonNegative = Field(default=None, alias="thinkingBudgetTokens")
    reasoning_effort: str = Field(default=None, alias="reasoningEffort")
    max_turns: NonNegative = Field(default=None, alias="maxTurns")
    use_weak_model: bool = Field(default=None, alias="useWeakModel")
    no_tools: bool = Field(default=None, alias="noTools")
    no_extensions: bool = Field(default=None, alias="noExtensions")
    no_skills: bool = Field(default=None, alias="noSkills")
    allowed_tools: list[str] = Field(default=None, alias="allowedTools")
    allowed_commands: list[str] = Field(default=None, alias="allowedCommands")
    enable_fs_search_tools: bool = Field(default=None, alias="enableFSSearchTools")

    @field_validator("reasoning_effort")
    @classmethod
    def _effort(cls, value: str) -> str:
        folded = value.strip().lower()
        if folded not in REASONING_EFFORTS:
            raise ValueError(f"must be one of {', '.join(REASONING_EFFORTS)}")
        return folded

    @field_validator("allowed_tools", "allowed_commands")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for index, item in enumerate(value):
            if item.strip() == "":
                raise ValueError(f"item {index} must not be blank")
        return value


# Finite, never negative, and bounded so that sums stay inside a 64-bit column (costs are
# kept in nano-dollars).
Money = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=10**15)]


class Usage(Strict):
    """SPEC §10: what a ``usage`` event carries in ``input``; nothing else."""

    input_tokens: Count = Field(alias="inputTokens")
    output_tokens: Count = Field(alias="outputTokens")
    cache_read_tokens: Count = Field(default=0, alias="cacheReadTokens")
    cache_write_tokens: Count = Field(default=0, alias="cacheWriteTokens")
    cost_usd: Money = Field(default=0.0, alias="costUsd")
    model: str = Field(default=None)


class BudgetLimits(Strict):
    """SPEC §10 budget of a run's subtree; an omitted limit is unbounded."""

    max_runs: Count = Field(default=None, alias="maxRuns")
    max_live: Count = Field(default=None, alias="maxLive")
    max_tokens: Count = Field(default=None, alias="maxTokens")
    max_cost_usd: Money = Field(default=None, alias="maxCostUsd")
    max_seconds: Annotated[int, Field(gt=0, le=10**12)] = Field(default=None, alias="maxSeconds")
    # SPEC §14: what the limit does when crossed (absent: "cancel", or what is set already).
    on_limit: Literal["cancel", "pause"] = Field(default=None, alias="onLimit")


class Profile(Strict):
    """An execution preset an extension registers. Prompt content only, never a path."""

    name: str
    options: Options = Field(default=None)
    system_prompt: str = Field(default="", alias="systemPrompt")
    # SPEC §11: the approval policy every run of this preset starts with, checked by the
    # approvals service when the runner registers.
    approvals: dict[str, Any] = Field(default=None)
    # SPEC §14: the runner says which presets can fork; absent means it cannot.
    can_fork: bool = Field(default=None, alias="canFork")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        _not_blank(value, "name")
        _max_bytes(value, MAX_ID_BYTES, "name")
        if any(ch in value for ch in "/\\\x00"):
            raise ValueError("name must not contain '/', '\\' or NUL")
        return value

    @field_validator("system_prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        return _max_bytes(value, MAX_SYSTEM_PROMPT_BYTES, "systemPrompt")


class Extension(Strict):
    extension_id: ValidId = Field(alias="extensionId")
    generation: Generation
    presets: list[Profile] = Field(default_factory=list)

    @field_validator("presets")
    @classmethod
    def _presets(cls, value: list[Profile]) -> list[Profile]:
        if len(value) > MAX_PRESETS_PER_EXTENSION:
            raise ValueError(f"at most {MAX_PRESETS_PER_EXTENSION} presets per extension")
        seen = set()
        for preset in value:
            if preset.name in seen:
                raise ValueError(f"duplicate preset name {preset.name!r}")
            seen.add(preset.name)
        return value


class RequestOptions(Options):
    """A request's options may also carry a budget for the child's subtree (SPEC §10)."""

    budget: BudgetLimits = Field(default=None)
    # SPEC §11: the child's approval policy; like the budget, not an option that narrows by
    # key (it narrows by the strictest-of-the-chain rule), checked by the approvals service.
    approvals: dict[str, Any] = Field(default=None)


class Request(Strict):
    """What a parent asks for in ``child.start``."""

    request_id: str = Field(alias="requestId")
    profile: str
    message: str
    system_prompt: str = Field(default=None, alias="systemPrompt")
    cwd: str = Field(default=None)
    context_mode: Literal["", "fresh", "fork"] = Field(default=None, alias="contextMode")
    resume: ValidId = Field(default=None)
    options: RequestOptions = Field(default=None)
    lease_id: ValidId = Field(default=None, alias="leaseId")

    @field_validator("request_id")
    @classmethod
    def _request_id(cls, value: str) -> str:
        _not_blank(value, "requestId")
        return _max_bytes(value, MAX_ID_BYTES, "requestId")

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str) -> str:
        return _not_blank(value, "profile")

    @field_validator("message")
    @classmethod
    def _message(cls, value: str) -> str:
        _not_blank(value, "message")
        return _max_bytes(value, MAX_MESSAGE_BYTES, "message")

    @field_validator("system_prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        return _max_bytes(value, MAX_SYSTEM_PROMPT_BYTES, "systemPrompt")

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("cwd must not contain NUL")
        return _max_bytes(value, MAX_CWD_BYTES, "cwd")

    @model_validator(mode="after")
    def _resume_not_fork(self):
        if self.resume is not None and self.context_mode == "fork":
            raise ValueError("resume cannot be combined with contextMode 'fork'")
        return self

    @property
    def mode(self) -> str:
        return self.context_mode or "fresh"


def confine_cwd(cwd: str, workspace: str) -> str:
    """Resolve ``cwd`` inside ``workspace``; refuse anything that escapes it."""
    base = posixpath.normpath(workspace)
    target = posixpath.normpath(posixpath.join(base, cwd))
    if target != base and not target.startswith(base.rstrip("/") + "/"):
        raise ValueError(f"cwd {cwd!r} is outside the parent's workspace {workspace!r}")
    return target


class Event(Strict):
    """One step of a run's stream. ``sequence`` is the server's; runners never send it."""

    kind: str
    text: str = Field(default=None)
    tool_name: str = Field(default=None, alias="toolName")
    tool_call_id: str = Field(default=None, alias="toolCallId")
    input: Any = Field(default=None)
    tool_output: Any = Field(default=None, alias="toolOutput")
    success: bool = Field(default=None)
    error: str = Field(default=None)

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        _not_blank(value, "kind")
        return _max_bytes(value, MAX_KIND_BYTES, "kind")


# --- Runner -> server params --------------------------------------------------------------


class RegisterParams(Strict):
    host_instance_id: ValidId = Field(alias="hostInstanceId")
    extensions: list[Extension] = Field(default_factory=list)
    workspace: str = Field(default=None)

    @field_validator("extensions")
    @classmethod
    def _unique(cls, value: list[Extension]) -> list[Extension]:
        ids = [ext.extension_id for ext in value]
        if len(ids) != len(set(ids)):
            raise ValueError("duplicate extensionId")
        return value

    @field_validator("workspace")
    @classmethod
    def _workspace(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("workspace must be an absolute path")
        return _max_bytes(value, MAX_CWD_BYTES, "workspace")


class RunOpenParams(Strict):
    conversation_id: ValidId = Field(alias="conversationId")
    run_id: ValidId = Field(alias="runId")
    profile: str = Field(default=None)
    extension_id: ValidId = Field(default=None, alias="extensionId")
    meta: dict[str, Any] = Field(default=None, alias="_meta")
    budget: BudgetLimits = Field(default=None)
    # The task the runner opens the run for (``runner --root MESSAGE``): shown as the run's
    # name on every page, as a launched run's message is. Optional, as SPEC §4 has it.
    message: str = Field(default=None)

    @field_validator("message")
    @classmethod
    def _message(cls, value: str) -> str:
        return _max_bytes(value, MAX_MESSAGE_BYTES, "message")

    # SPEC §11: the run's own approval policy {rules, default}, checked by the service.
    approvals: dict[str, Any] = Field(default=None)


class RunEventParams(Strict):
    run_id: ValidId = Field(alias="runId")
    from_: int = Field(alias="from", ge=1)
    events: list[Event]


class RunFinishParams(Strict):
    run_id: str = Field(alias="runId")
    output: str = Field(default=None)
    error: str = Field(default=None)
    cancelled: bool = Field(default=None)


class ToolEndParams(Strict):
    run_id: str = Field(alias="runId")
    tool_call_id: str = Field(alias="toolCallId")


class RunTokenParams(Strict):
    """``run.mcpToken`` (SPEC §9)."""

    run_id: ValidId = Field(alias="runId")


class Params(Strict):
    """The child methods' ``Params``, exactly as upstream (camelCase)."""

    run_id: str = Field(default=None, alias="runId")
    tool_call_id: str = Field(default=None, alias="toolCallId")
    extension_id: str = Field(default=None, alias="extensionId")
    generation: Generation = Field(default=None)
    # Kept raw here and validated as a Request after the caller's authority is checked,
    # because SPEC §6 orders child.start's checks that way.
    request: dict[str, Any] = Field(default=None)
    child_id: ValidId = Field(default=None, alias="childId")
    child_run_id: ValidId = Field(default=None, alias="childRunId")
    message: str = Field(default=None)
    request_id: str = Field(default=None, alias="requestId")
    lease_id: ValidId = Field(default=None, alias="leaseId")
    after: NonNegative = Field(default=None)

    def require(self, *names: str) -> None:
        """Each child method needs its own subset of the shared Params fields."""
        for name in names:
            if getattr(self, name) is None:
                raise RpcError(INVALID_PARAMS, f"{_ALIASES[name]}: required field missing")


_ALIASES = {name: (info.alias or name) for name, info in Params.model_fields.items()}


# --- Server -> client shapes --------------------------------------------------------------


class RunSnapshot(BaseModel):
    """The fields of SPEC §6 ``Result`` but its events: what every run view starts from."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    runner_id: str = Field(alias="runnerId")
    host_instance_id: str = Field(alias="hostInstanceId")
    conversation_id: str = Field(alias="conversationId")
    run_id: str = Field(alias="runId")
    parent_conversation_id: str = Field(alias="parentConversationId")
    parent_run_id: str = Field(alias="parentRunId")
    extension_id: str = Field(alias="extensionId")
    profile: str
    done: bool
    cancelled: bool
    error: str
    output: str
    depth: int
    status: str
    # SPEC §9 Conclusions (delegation.wire.conclusions' stored shape); None until concluded.
    conclusion: dict[str, Any] | None = None


class Result(RunSnapshot):
    """A run's snapshot. Every field is always present (``""``, ``false``, ``[]`` when empty)."""

    events: list[dict[str, Any]]


# SPEC §6 ``Result``'s keys in the SPEC's order (``events`` after ``output``), and §9's
# ``conclusion``: the one place they are written. The REST shapes (``dashboard.api.schemas.runs``)
# are built from ``Result`` in this order, so the three views of a run cannot drift apart.
RESULT_KEYS = (
    "runnerId",
    "hostInstanceId",
    "conversationId",
    "runId",
    "parentConversationId",
    "parentRunId",
    "extensionId",
    "profile",
    "done",
    "cancelled",
    "error",
    "output",
    "events",
    "depth",
    "status",
    "conclusion",
)
if set(RESULT_KEYS) != {f.alias or n for n, f in Result.model_fields.items()}:
    raise RuntimeError("RESULT_KEYS and Result's fields differ")

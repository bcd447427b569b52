"""The live socket's frames: what a client may send (parsed strictly) and what the server sends.

Outbound frames are built as dicts for speed; the models below document them and the tests
validate every frame against them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from delegation.errors import RpcError
from delegation.wire import RunSnapshot, describe, loads_strict, valid_id

MAX_ROOTS = 200


# --- Frames in -------------------------------------------------------------------------------


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SubscribeRun(_In):
    type: Literal["subscribe"]
    run_id: str = Field(alias="runId")
    after: int = Field(default=0, ge=0)

    @field_validator("run_id")
    @classmethod
    def _id(cls, value: str) -> str:
        return valid_id(value, "runId")


class SubscribeTree(_In):
    type: Literal["subscribe"]
    tree_id: str = Field(alias="treeId")
    # The snapshot as column arrays ("treeCols" frames): a third of the bytes of row objects
    # and much cheaper to parse at 100,000 runs. Changes still come as "rows".
    compact: bool = False

    @field_validator("tree_id")
    @classmethod
    def _id(cls, value: str) -> str:
        return valid_id(value, "treeId")


class SubscribeRoots(_In):
    type: Literal["subscribe"]
    roots: list[str] = Field(max_length=MAX_ROOTS)
    new_trees: bool = Field(default=False, alias="newTrees")

    @field_validator("roots")
    @classmethod
    def _ids(cls, value: list[str]) -> list[str]:
        for index, item in enumerate(value):
            valid_id(item, f"roots[{index}]")
        return value


class SubscribeRunners(_In):
    type: Literal["subscribe"]
    runners: Literal[True]


class SubscribeApprovals(_In):
    type: Literal["subscribe"]
    approvals: Literal[True]


class Unsubscribe(_In):
    type: Literal["unsubscribe"]
    run_id: str = Field(default=None, alias="runId")
    tree_id: str = Field(default=None, alias="treeId")
    roots: list[str] = Field(default=None)
    runners: Literal[True] = Field(default=None)
    approvals: Literal[True] = Field(default=None)


class Ping(_In):
    type: Literal["ping"]


SUBSCRIPTION_KEYS = {
    "runId": SubscribeRun,
    "treeId": SubscribeTree,
    "roots": SubscribeRoots,
    "runners": SubscribeRunners,
    "approvals": SubscribeApprovals,
}


class FrameError(Exception):
    def __init__(self, field: str, message: str, code: str = "invalid"):
        super().__init__(message)
        self.field = field
        self.message = message
        self.code = code


def parse_client_frame(text: str):
    """Decode one client frame strictly into its model, or raise FrameError naming the field."""
    try:
        frame = loads_strict(text)
    except RpcError as exc:
        raise FrameError("", exc.message) from None
    if not isinstance(frame, dict):
        raise FrameError("", "frame: must be a JSON object")
    kind = frame.get("type")
    if "type" not in frame:
        raise FrameError("type", "type: required field missing")
    if kind == "subscribe":
        present = [key for key in SUBSCRIPTION_KEYS if key in frame]
        if len(present) != 1:
            raise FrameError(
                "runId",
                "subscribe: exactly one of runId, treeId, roots, runners or approvals is required",
            )
        model = SUBSCRIPTION_KEYS[present[0]]
    elif kind == "unsubscribe":
        model = Unsubscribe
    elif kind == "ping":
        model = Ping
    else:
        raise FrameError(
            "type", f"type: must be 'subscribe', 'unsubscribe' or 'ping', got {kind!r}"
        )
    try:
        return model.model_validate(frame, strict=True)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]["loc"]
        return_field = ".".join(str(p) for p in first if not str(p).startswith("function"))
        raise FrameError(return_field, describe(exc)) from None


# --- Frames out (documented and checked by the tests; built as dicts for speed) -------------


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class LiveEvent(_Out):
    sequence: int
    kind: str
    text: str | None = None
    tool_name: str | None = Field(default=None, alias="toolName")
    tool_call_id: str | None = Field(default=None, alias="toolCallId")
    input: Any = None
    tool_output: Any = Field(default=None, alias="toolOutput")
    success: bool | None = None
    error: str | None = None
    truncated: bool = False
    actor: str = ""
    data: Any = None
    created_at: int = Field(alias="createdAt")


class HelloFrame(_Out):
    type: Literal["hello"]
    heartbeat_seconds: float = Field(alias="heartbeatSeconds")
    server_time: int = Field(alias="serverTime")
    user: str
    role: str
    can_act: bool = Field(alias="canAct")


class SubscribedFrame(_Out):
    type: Literal["subscribed"]
    run_id: str | None = Field(default=None, alias="runId")
    tree_id: str | None = Field(default=None, alias="treeId")
    roots: list[str] | None = None
    runners: bool | None = None
    approvals: bool | None = None
    after: int | None = None


class RunState(RunSnapshot):
    last_sequence: int = Field(alias="lastSequence")
    created_at: int = Field(alias="createdAt")
    finished_at: int | None = Field(alias="finishedAt")
    cancel_requested_at: int | None = Field(alias="cancelRequestedAt")
    cancel_reason: str = Field(alias="cancelReason")
    refused_spawns: int = Field(alias="refusedSpawns")


class RunFrame(_Out):
    type: Literal["run"]
    run: RunState


class EventsFrame(_Out):
    type: Literal["events"]
    run_id: str = Field(alias="runId")
    events: list[LiveEvent]


class TreeUsage(_Out):
    """The subtree's rollup (itself included): tokens in + out, cost, runs, live runs."""

    tokens: int
    cost_usd: float = Field(alias="costUsd")
    own_cost_usd: float = Field(alias="ownCostUsd")
    live: int
    runs: int


class TreeBudget(_Out):
    """The run's budget: its limits by name, and why it stopped the subtree (if it did)."""

    limits: dict[str, float]
    warned: bool
    exceeded_reason: str = Field(alias="exceededReason")


class TreeRow(_Out):
    pk: int
    run_id: str = Field(alias="runId")
    parent_run_id: str = Field(alias="parentRunId")
    parent_pk: int | None = Field(alias="parentPk")
    depth: int
    status: str
    profile: str
    runner: str
    created_at: int = Field(alias="createdAt")
    finished_at: int | None = Field(alias="finishedAt")
    events: int
    refused_spawns: int = Field(alias="refusedSpawns")
    via: str
    cancel_requested: bool = Field(alias="cancelRequested")
    under_lease: bool = Field(alias="underLease")
    leases: list[dict[str, Any]]
    usage: TreeUsage
    budget: TreeBudget | None
    task: str
    activity: str
    conclusion_status: str | None = Field(default=None, alias="conclusionStatus")
    # SPEC §11: approvals waiting on this run, and in its subtree (this run's included).
    pending_approvals: int = Field(default=0, alias="pendingApprovals")
    sub_pending_approvals: int = Field(default=0, alias="subPendingApprovals")


class TreeFrame(_Out):
    type: Literal["tree"]
    tree_id: str = Field(alias="treeId")
    runs: list[TreeRow]
    more: bool


class TreeColsFrame(_Out):
    """A chunk of the tree snapshot, one array per field (index i of every array is one run);
    ``parentPk`` names the parent by its pk, sent in an earlier row; ``leases`` is sparse, and
    so is ``approvals`` (pk -> [pending on the run, pending in its subtree])."""

    type: Literal["treeCols"]
    tree_id: str = Field(alias="treeId")
    columns: dict[str, list[Any]]
    leases: dict[str, list[dict[str, Any]]]
    approvals: dict[str, list[int]] = Field(default_factory=dict)
    more: bool


class RowsFrame(_Out):
    type: Literal["rows"]
    tree_id: str = Field(alias="treeId")
    runs: list[TreeRow]


class SummaryFrame(_Out):
    type: Literal["summary"]
    tree_id: str = Field(alias="treeId")
    counts: dict[str, int]
    max_depth: int = Field(alias="maxDepth")
    runs: int
    status: str
    profile: str
    runner_id: str = Field(alias="runnerId")
    conversation_id: str = Field(alias="conversationId")
    task: str = ""  # the root's task: the tree's name (issue 25)
    tokens: int
    cost_usd: float = Field(alias="costUsd")
    budget_stopped: str = Field(alias="budgetStopped")


class NewTreeFrame(_Out):
    type: Literal["newTree"]
    tree_id: str = Field(alias="treeId")


class RunnersFrame(_Out):
    type: Literal["runners"]
    runners: list[dict[str, Any]]


class ApprovalsFrame(_Out):
    """A doorbell for the inbox: how many approvals are pending; the list is read by REST."""

    type: Literal["approvals"]
    pending: int


class HeartbeatFrame(_Out):
    type: Literal["heartbeat"]
    at: int
    runs: dict[str, int]
    trees: dict[str, int]


class ErrorFrame(_Out):
    type: Literal["error"]
    code: str
    field: str
    message: str


SERVER_FRAMES = {
    "hello": HelloFrame,
    "subscribed": SubscribedFrame,
    "run": RunFrame,
    "events": EventsFrame,
    "tree": TreeFrame,
    "treeCols": TreeColsFrame,
    "rows": RowsFrame,
    "summary": SummaryFrame,
    "newTree": NewTreeFrame,
    "runners": RunnersFrame,
    "approvals": ApprovalsFrame,
    "heartbeat": HeartbeatFrame,
    "error": ErrorFrame,
    "pong": None,
}

"""Approvals (SPEC §11): an approval, a page of them, and a run's policy."""

from __future__ import annotations

from typing import Any

from ninja import Schema
from pydantic import Field


class ApprovalOut(Schema):
    approvalId: str
    runId: str
    task: str = Field(description="The run's task (first line of its request message)")
    rootRunId: str
    rootTask: str = Field(description="The task of the tree's top-level run: the tree's name")
    depth: int
    profile: str
    runner: str
    via: str = Field(description="runner (approval.request) or mcp (the approve tool)")
    canEdit: bool = Field(
        description="Whether the door can run an edited input: false for an ACP agent, which "
        "answers with an option id only (an allow with updatedInput is then 409)"
    )
    toolCallId: str
    toolName: str
    kind: str = Field(description='The ACP tool kind, "" when the agent gave none')
    title: str
    input: Any
    status: str = Field(description="pending, decided or expired")
    decision: str = Field(description='allow or deny; "" while pending')
    message: str
    updatedInput: Any = Field(description="An operator's edit of the input (allow only)")
    scope: str = Field(description='once or always; "" while pending')
    decidedBy: str = Field(description="policy, operator:<name>, timeout or cancel")
    requestedAt: str
    decidedAt: str | None


class ApprovalPage(Schema):
    items: list[ApprovalOut]
    next: str | None


class PolicyOut(Schema):
    runId: str
    policy: dict[str, Any] | None = Field(description="The run's own policy; null if none")
    chain: list[dict[str, Any]] = Field(
        description="Every policy that weighs on the run, root first (strictest wins)"
    )

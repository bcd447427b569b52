"""The MCP tool ``approve`` (SPEC §11): Claude Code's ``--permission-prompt-tool``.

Claude Code calls it with ``{tool_name, input, tool_use_id}`` before a tool use its own
configuration does not allow, and reads the answer as exactly one text block holding
``{"behavior": "allow", "updatedInput": {...}}`` or ``{"behavior": "deny", "message": ...}``;
a result with structured content beside the text is rejected by the CLI as invalid, so this
tool answers without it. While an approval is pending the call waits on its run's doorbell
(``waiting.wait_until``: no thread, no database connection), sending progress so the agent's
``MCP_TOOL_TIMEOUT`` clock sees it alive.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from channels.db import database_sync_to_async
from django.conf import settings
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent
from pydantic import Field

from delegation.errors import NO_SUCH_RUN, RpcError
from delegation.mcp.calls import call_service, refused
from delegation.mcp.waiting import wait_until
from delegation.models import ApprovalStatus
from delegation.selectors.approvals import approval_state, approved_input
from delegation.services import approval_endings, approvals, run_tokens
from delegation.services.identity import Caller
from delegation.services.run_tokens import RunCaller

# Past the timeout the waiting call expires the approval itself rather than wait on a sweep.
TIMEOUT_SLACK_SECONDS = 1.0


def _request(run_caller: RunCaller, caller: Caller, use: approvals.ToolUse):
    run = run_tokens.run_of(run_caller)
    if run is None:
        raise RpcError(NO_SUCH_RUN, "the run token's run is gone")
    approval = approvals.do_request_approval(
        run=run, use=use, via=approvals.VIA_MCP, actor_label=caller.label(run.runner)
    )
    return approval.pk, run.pk


def answer(approval) -> CallToolResult:
    """The permission-prompt answer: one text block, no structured content."""
    if approval.decision == "allow":
        body = {"behavior": "allow", "updatedInput": approved_input(approval)}
    else:
        body = {"behavior": "deny", "message": approval.message or "denied"}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(body))])


def _denied(message: str) -> CallToolResult:
    body = {"behavior": "deny", "message": message}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(body))])


async def wait_for_decision(ctx: Context, approval_pk: int, run_pk: int):
    """The decision, or ``RpcError`` −32001 as soon as the caller's run token stops holding
    (issue 35: a rotated runner token's waiting approve delivered allow 2.8 s later)."""
    read = database_sync_to_async(approval_state)
    seconds = settings.APPROVAL_TIMEOUT_SECONDS + TIMEOUT_SLACK_SECONDS
    approval = await wait_until(
        ctx,
        run_pk,
        seconds,
        "an operator's approval",
        lambda: call_service(lambda _run, _caller: approval_state(approval_pk), ctx),
        lambda a: a.status != ApprovalStatus.PENDING,
    )
    if approval.status == ApprovalStatus.PENDING:
        await database_sync_to_async(approval_endings.expire_one)(approval_pk, run_pk)
        approval = await read(approval_pk)
    return approval


def add_approve(server: MCPServer) -> None:
    @server.tool(
        name="approve",
        description=(
            "Ask Canopy whether a tool use may run (Claude Code's --permission-prompt-tool). "
            "Decided by the run's approval policy or by an operator; waits for the decision."
        ),
    )
    async def approve(
        ctx: Context,
        tool_name: Annotated[str, Field(description="The tool the agent wants to use.")],
        input: Annotated[  # noqa: A002 - the name Claude Code sends
            dict[str, Any], Field(description="The tool's input, as the agent would run it.")
        ],
        tool_use_id: Annotated[
            str | None, Field(description="The agent's id of this tool use.")
        ] = None,
    ) -> CallToolResult:
        use = approvals.ToolUse(tool_name=tool_name, input=input, tool_call_id=tool_use_id or "")
        try:
            approval_pk, run_pk = await call_service(_request, ctx, use)
        except RpcError as error:
            # Fail closed: an approval that cannot be asked for is a denial the agent reads.
            return _denied(f"Canopy refused the approval request: {error.message}")
        try:
            approval = await wait_for_decision(ctx, approval_pk, run_pk)
        except RpcError as error:
            return refused(error)  # the token died while it waited: −32001, not a decision
        return answer(approval)

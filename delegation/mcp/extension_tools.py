"""The tools of a run's hosted kodelet extensions, as tools of ``/mcp`` for that run (§15).

The runner says which tools a run hosts with an ``extension-tools`` event of the run (its
``input``: ``{"tools": [{name, description, inputSchema}]}``), so every server process reads
the same list from the run's stream. A call of one is the ``extension.tool.call`` command to
the run's runner (stored, resent after a reconnect, answered once: the runner dedupes by
command); the runner's answer is the tool's result, kept on the command, which the call
polls for: at most one short query every ``POLL_SECONDS`` per waiting call, no connection held
meanwhile. A new server → runner method, listed in docs/explanation/spec-deviations.md.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, TextContent, Tool

from delegation.errors import INVALID_PARAMS, RpcError
from delegation.mcp.calls import call_service
from delegation.models import Command, RunStatus
from delegation.selectors.events import latest_event_input
from delegation.selectors.runners import command_answer
from delegation.services import run_tokens
from delegation.services.outbox import enqueue

TOOLS_KIND = "extension-tools"
POLL_SECONDS = 0.25
# kodelet-subagent's wait_agent may wait 5 minutes; a call waits a little longer than that.
CALL_TIMEOUT = 330.0


def _hosted(run_caller, caller) -> list[dict]:
    latest = latest_event_input(run_caller.run_pk, TOOLS_KIND)
    tools = latest.get("tools") if isinstance(latest, dict) else None
    return [t for t in tools or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]


def _forward(run_caller, caller, name: str, arguments: dict) -> int:
    run = run_tokens.run_of(run_caller)
    if run is None or run.status != RunStatus.RUNNING:
        raise RpcError(INVALID_PARAMS, f"run {run_caller.run_id!r} is not running")
    params = {
        "runId": run_caller.run_id,
        "toolCallId": f"mcp-{uuid.uuid4().hex}",
        "name": name,
        "input": arguments,
    }
    return enqueue(run_caller.runner_pk, Command.Method.EXTENSION_TOOL_CALL, params, run=run).pk


def _answer(run_caller, caller, command_pk: int) -> dict | None:
    row = command_answer(command_pk, run_caller.runner_pk)
    if row is None or row["answered_at"] is None:
        return None
    return row["result"] if isinstance(row["result"], dict) else {}


async def hosted_tools(ctx: Context) -> list[Tool]:
    """The caller's run's hosted tools (none when the token does not hold: the static list
    answers then, and every call refuses on its own)."""
    try:
        tools = await call_service(_hosted, ctx)
    except RpcError:
        return []
    return [
        Tool(
            name=t["name"],
            description=str(t.get("description") or ""),
            input_schema=t.get("inputSchema") or {"type": "object"},
        )
        for t in tools
    ]


async def call_hosted(ctx: Context, name: str, arguments: Any) -> CallToolResult | None:
    """The hosted tool's result, or ``None`` when the caller's run hosts no such tool."""
    if name not in {t.name for t in await hosted_tools(ctx)}:
        return None
    if not isinstance(arguments, dict):
        raise RpcError(INVALID_PARAMS, "arguments: must be an object")
    command_pk = await call_service(_forward, ctx, name, arguments)
    async with asyncio.timeout(CALL_TIMEOUT):
        while (answer := await call_service(_answer, ctx, command_pk)) is None:
            await asyncio.sleep(POLL_SECONDS)
    if "error" in answer and isinstance(answer["error"], dict):  # the runner refused it
        answer = {"content": answer["error"].get("message", ""), "error": answer["error"]}
    text = answer.get("content")
    structured = answer.get("structuredContent")
    return CallToolResult(
        content=[
            TextContent(type="text", text=text if isinstance(text, str) else json.dumps(text))
        ],
        structured_content=structured if isinstance(structured, dict) else None,
        is_error=bool(answer.get("error")),
    )

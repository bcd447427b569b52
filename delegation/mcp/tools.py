"""The MCP tools (SPEC §9) and the §6 child service each one calls, with the caller's run as
the parent: every rule, cap and idempotency of the runner path holds here too."""

from __future__ import annotations

import sys
import uuid
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from delegation.errors import RpcError
from delegation.mcp.approve import add_approve
from delegation.mcp.arguments import StrictMCPServer
from delegation.mcp.calls import call_service, child_params, ok, refused
from delegation.mcp.join import JOIN_INSTRUCTIONS, add_join_tools
from delegation.mcp.waiting import wait_on_run, wait_seconds
from delegation.selectors.profiles import profiles_caller_may_start
from delegation.services import children, run_tokens
from delegation.services.identity import Caller
from delegation.services.run_tokens import RunCaller

# --- the services each tool calls --------------------------------------------------------


def _delegate(run_caller: RunCaller, caller: Caller, request: dict) -> dict:
    return children.start_child(caller, child_params(run_caller, request=request))


def _read(run_caller: RunCaller, caller: Caller, child_id: str, after: int | None) -> dict:
    return children.read_child(caller, child_params(run_caller, childId=child_id, after=after))


def _state(run_caller: RunCaller, caller: Caller, child_id: str) -> dict:
    # Past any sequence: the same ownership checks as read_child, without reading a page.
    return _read(run_caller, caller, child_id, sys.maxsize)


def _cancel(run_caller: RunCaller, caller: Caller, child_id: str) -> dict:
    return children.cancel_child(caller, child_params(run_caller, childId=child_id))


def _steer(run_caller: RunCaller, caller: Caller, child_id: str, message, request_id) -> dict:
    params = child_params(run_caller, childId=child_id, message=message, requestId=request_id)
    return children.steer_child(caller, params)


def _profiles(run_caller: RunCaller, caller: Caller) -> dict:
    run = run_tokens.run_of(run_caller)
    return profiles_caller_may_start(
        runner_pk=run_caller.runner_pk,
        extension_id=run_caller.extension_id,
        level=caller.level_of(run),
    ).wire()


def _new_request_id() -> str:
    return f"mcp-{uuid.uuid4().hex}"


# --- the tools ---------------------------------------------------------------------------

WAIT = Annotated[
    float | None,
    Field(
        description="Seconds (0-50) to wait before answering. delegate: until the child is done. "
        "read_child: until a new event arrives or the child is done. Omit or 0 to answer at once."
    ),
]
CHILD_ID = Annotated[
    str, Field(description="The child's id: the conversationId that delegate returned.")
]
INSTRUCTIONS = (
    "Canopy runs your subagents (children). delegate starts one with a profile from "
    "list_profiles; read_child follows its events and result; steer_child sends it a "
    "message; cancel_child stops it. Delegation depth is capped: when a call is refused "
    "with code -32010, do the work yourself."
)


def build_server() -> MCPServer:
    server = StrictMCPServer("canopy", instructions=INSTRUCTIONS + JOIN_INSTRUCTIONS)
    _add_delegate(server)
    _add_read_child(server)
    _add_steer_child(server)
    _add_cancel_child(server)
    _add_list_profiles(server)
    # Fan out and join (issue 24): await_children, conclude.
    add_join_tools(server)
    add_approve(server)
    server.make_strict()
    return server


def _add_delegate(server: MCPServer) -> None:
    # Long because the tool's signature is its published schema: each argument carries the
    # description an agent reads, so they stay here, next to the code that uses them.
    @server.tool(
        name="delegate",
        description=(
            "Start a child agent (subagent) that works on `message` with the given `profile` "
            "(see list_profiles). Returns the child's Result: its childId (`conversationId`), "
            "`runId`, `depth`, `status`, `done`, `output`, `error`. Pass `waitSeconds` to wait "
            "for the child to finish. The same `requestId` with the same input returns the same "
            "child instead of starting another. Refused (isError, code -32010) when your "
            "delegation depth limit is reached: then finish the work yourself."
        ),
    )
    async def delegate(
        ctx: Context,
        profile: Annotated[str, Field(description="The child's profile (a preset name).")],
        message: Annotated[str, Field(description="The task for the child, in plain words.")],
        requestId: Annotated[  # noqa: N803
            str | None,
            Field(
                description="An idempotency key: repeat it to get the same child back "
                "instead of starting a second one. Generated when omitted."
            ),
        ] = None,
        options: Annotated[
            dict[str, Any] | None,
            Field(
                description="Execution options that may only narrow yours: model, maxTokens, "
                "maxTurns, reasoningEffort, allowedTools, allowedCommands, noTools, ..."
            ),
        ] = None,
        cwd: Annotated[
            str | None,
            Field(description="Working directory for the child, inside your workspace."),
        ] = None,
        contextMode: Annotated[  # noqa: N803
            str | None,
            Field(description="'fresh' (default: a new conversation) or 'fork' (your context)."),
        ] = None,
        resume: Annotated[
            str | None,
            Field(description="The childId of an earlier child of yours to continue."),
        ] = None,
        waitSeconds: WAIT = None,  # noqa: N803
    ) -> CallToolResult:
        try:
            wait = wait_seconds(waitSeconds)
            request = {"requestId": requestId or _new_request_id(), "profile": profile}
            request["message"] = message
            for key, value in (
                ("options", options),
                ("cwd", cwd),
                ("contextMode", contextMode),
                ("resume", resume),
            ):
                if value is not None:
                    request[key] = value
            result = await call_service(_delegate, ctx, request)
            if wait and not result["done"]:
                child_id = result["conversationId"]
                # Events stay with read_child (paged); delegate answers with the child's state.
                result = await wait_on_run(
                    ctx,
                    result["runId"],
                    wait,
                    f"child {child_id}",
                    lambda: call_service(_state, ctx, child_id),
                    lambda r: r["done"],
                )
            return ok(result)
        except RpcError as error:
            return refused(error)


def _add_read_child(server: MCPServer) -> None:
    @server.tool(
        name="read_child",
        description=(
            "Read one of your children: its status, output, error and the events after "
            "`after` (a page; read again after the last `sequence` you got). With "
            "`waitSeconds`, waits for a new event or for the child to finish."
        ),
    )
    async def read_child(
        ctx: Context,
        childId: CHILD_ID,  # noqa: N803
        after: Annotated[
            int | None,
            Field(description="Return only events with a higher sequence (default 0: all)."),
        ] = None,
        waitSeconds: WAIT = None,  # noqa: N803
    ) -> CallToolResult:
        try:
            wait = wait_seconds(waitSeconds)
            result = await call_service(_read, ctx, childId, after)
            if wait and not result["events"] and not result["done"]:
                result = await wait_on_run(
                    ctx,
                    result["runId"],
                    wait,
                    f"child {childId}",
                    lambda: call_service(_read, ctx, childId, after),
                    lambda r: bool(r["events"]) or r["done"],
                )
            return ok(result)
        except RpcError as error:
            return refused(error)


def _add_steer_child(server: MCPServer) -> None:
    @server.tool(
        name="steer_child",
        description=(
            "Send a message to one of your running children, delivered into its current turn. "
            "Answers {outcome: 'injected'} or {outcome: 'promptRequired', reason} when the child "
            "has no running turn. The same `requestId` is answered once."
        ),
    )
    async def steer_child(
        ctx: Context,
        childId: CHILD_ID,  # noqa: N803
        message: Annotated[str, Field(description="What to tell the child (≤ 10,000 bytes).")],
        requestId: Annotated[  # noqa: N803
            str | None,
            Field(description="An idempotency key for this steer. Generated when omitted."),
        ] = None,
    ) -> CallToolResult:
        try:
            request_id = requestId or _new_request_id()
            answer = await call_service(_steer, ctx, childId, message, request_id)
            return ok({"outcome": answer["outcome"], "reason": answer.get("reason", "")})
        except RpcError as error:
            return refused(error)


def _add_cancel_child(server: MCPServer) -> None:
    @server.tool(
        name="cancel_child",
        description=(
            "Cancel one of your children (and its own children). Answers at once with its "
            "Result; `done` and `cancelled` become true once it has stopped."
        ),
    )
    async def cancel_child(ctx: Context, childId: CHILD_ID) -> CallToolResult:  # noqa: N803
        try:
            return ok(await call_service(_cancel, ctx, childId))
        except RpcError as error:
            return refused(error)


def _add_list_profiles(server: MCPServer) -> None:
    @server.tool(
        name="list_profiles",
        description=(
            "The profiles (presets) you may start children with, your delegation depth and the "
            "maximum; `maySpawn` false means delegate will be refused: do the work yourself."
        ),
    )
    async def list_profiles(ctx: Context) -> CallToolResult:
        try:
            return ok(await call_service(_profiles, ctx))
        except RpcError as error:
            return refused(error)

"""One MCP tool call: the caller its run token stands for, the service call made on the
database thread, and the answer (a result or the §9 refusal shape)."""

from __future__ import annotations

import json

from channels.db import database_sync_to_async
from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, TextContent

from delegation import depth as depthlib
from delegation import notify
from delegation.errors import NOT_REGISTERED, PRESET_STALE, RpcError
from delegation.models import RunVia
from delegation.protocol import bearer_token
from delegation.services import run_tokens
from delegation.services.identity import Caller, Connection
from delegation.services.run_tokens import RunCaller
from delegation.wire.decode import parse_model
from delegation.wire.schemas import Params

# Also accepted under MCP's own _meta naming rules (a reverse-DNS prefix and a slash).
META_KEYS = (depthlib.META_KEY, "dev.pando/delegationDepth")


class _DeadToken(RpcError):
    def __init__(self):
        super().__init__(NOT_REGISTERED, "run token missing, wrong, or no longer valid")


def _declared_level(ctx: Context) -> int | None:
    """The highest valid level the agent declared on this call (header or ``_meta``)."""
    levels = []
    request = ctx.request_context.request
    if request is not None:
        header = request.headers.get(depthlib.HEADER)
        if header is not None:
            levels.append(depthlib.parse(header))
    meta = ctx.request_context.meta or {}
    for key in META_KEYS:
        if key in meta:
            levels.append(depthlib.parse_json_value(meta[key]))
    valid = [level for level in levels if level is not None]
    return max(valid) if valid else None


def _token_of(ctx: Context) -> str:
    request = ctx.request_context.request
    if request is None:
        return ""
    return (
        bearer_token(
            [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()]
        )
        or ""
    )


def authenticate(ctx: Context) -> RunCaller:
    """The caller's run, or ``_DeadToken`` (−32001) when its token no longer holds."""
    run_caller = run_tokens.authenticate_run_token(_token_of(ctx))
    if run_caller is None:
        raise _DeadToken()
    return run_caller


def _caller(ctx: Context) -> tuple[RunCaller, Caller]:
    """Checked at every call, not only when the token was issued."""
    run_caller = authenticate(ctx)
    caller = Caller(
        conn=Connection(runner_pk=run_caller.runner_pk, generation=run_caller.generation),
        via=RunVia.MCP.value,
        declared_depth=_declared_level(ctx),
    )
    return run_caller, caller


def child_params(run_caller: RunCaller, **fields) -> Params:
    """The §6 ``Params`` of a child method, with the caller's run as the parent."""
    if run_caller.extension_generation is None:
        raise RpcError(
            PRESET_STALE,
            "execution preset absent or stale: the run's runner has no registered extension "
            f"{run_caller.extension_id!r} to start children under",
        )
    raw = {
        "runId": run_caller.run_id,
        "extensionId": run_caller.extension_id,
        "generation": run_caller.extension_generation,
    }
    raw.update({key: value for key, value in fields.items() if value is not None})
    return parse_model(Params, raw)


def _call(function, ctx: Context, *args):
    """On the database thread: authenticate, call the service; doorbells are collected."""
    with notify.collect() as bells:
        try:
            run_caller, caller = _caller(ctx)
            return function(run_caller, caller, *args), None, bells
        except RpcError as exc:
            return None, exc, bells


async def call_service(function, ctx: Context, *args):
    """``function(run_caller, caller, *args)`` on the database thread; doorbells rung after."""
    result, error, bells = await database_sync_to_async(_call)(function, ctx, *args)
    if bells:
        await notify.ring_collected(bells)
    if error is not None:
        raise error
    return result


def ok(structured: dict) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(structured))],
        structured_content=structured,
    )


def refused(error: RpcError) -> CallToolResult:
    """The §9 refusal: ``isError``, a text naming the rule, ``{code, message}``."""
    return CallToolResult(
        content=[TextContent(type="text", text=f"{error.message} (code {error.code})")],
        structured_content={"code": error.code, "message": error.message},
        is_error=True,
    )

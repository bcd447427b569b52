"""The MCP front door (SPEC §9): ``/mcp``, streamable HTTP, served by the official ``mcp`` SDK.

A transport like the runner socket: each tool authenticates the run token, builds the caller
(the token's run as the parent, on its runner's current connection, ``via`` mcp), decodes its
arguments with the same strict schemas and calls the same typed child service as the §6
method it mirrors. A service refusal becomes an ``isError`` result whose
``structuredContent`` is ``{"code", "message"}`` with the §6 code.

Stateless streamable HTTP (no MCP session kept in the process), so any server process behind
the load balancer answers any call. ``waitSeconds`` waits on the run's doorbell on the
channel layer: no database connection and no thread is held while a call waits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Annotated, Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, TextContent
from pydantic import Field

from delegation import depth as depthlib
from delegation import notify, upkeep
from delegation.errors import INVALID_PARAMS, NOT_REGISTERED, PRESET_STALE, RpcError
from delegation.models import ExtensionPreset, RunVia
from delegation.protocol import bearer_token
from delegation.services import children, run_tokens
from delegation.services.base import Connection
from delegation.services.children import Caller
from delegation.services.run_tokens import MCP_PATH, RunCaller
from delegation.wire import Params, parse_model

log = logging.getLogger(__name__)

# Also accepted under MCP's own _meta naming rules (a reverse-DNS prefix and a slash).
META_KEYS = (depthlib.META_KEY, "dev.pando/delegationDepth")
# How often a waiting call sends notifications/progress, and re-reads the database in case a
# doorbell was lost (the channel layer may drop rings; the database is the record).
PROGRESS_SECONDS = 2.0
RECHECK_SECONDS = 5.0
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "lost"})


# --- the caller --------------------------------------------------------------------------


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


def _caller(ctx: Context) -> tuple[RunCaller, Caller]:
    """Checked at every call, not only when the token was issued."""
    run_caller = run_tokens.authenticate_run_token(_token_of(ctx))
    if run_caller is None:
        raise _DeadToken()
    caller = Caller(
        conn=Connection(runner_pk=run_caller.runner_pk, generation=run_caller.generation),
        via=RunVia.MCP.value,
        declared_depth=_declared_level(ctx),
    )
    return run_caller, caller


def _params(run_caller: RunCaller, **fields) -> Params:
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


async def _run(function, ctx: Context, *args):
    result, error, bells = await database_sync_to_async(_call)(function, ctx, *args)
    if bells:
        await notify.ring_collected(bells)
    if error is not None:
        raise error
    return result


# --- answers -----------------------------------------------------------------------------


def _ok(structured: dict) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(structured))],
        structured_content=structured,
    )


def _refused(error: RpcError) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=f"{error.message} (code {error.code})")],
        structured_content={"code": error.code, "message": error.message},
        is_error=True,
    )


# --- waiting on the doorbell -------------------------------------------------------------


async def _wait_until(ctx: Context, run_pk: int, seconds: float, label: str, read, satisfied):
    """Read, then wait on the run's doorbell and read again until ``satisfied`` or time is up.

    Joins the run's doorbell group on a fresh channel before the first read, so no ring is
    missed between them. While it waits only a channel-layer receive is pending: no thread
    and no database connection is held. Each ring (and every ``RECHECK_SECONDS``, for rings
    the layer dropped) costs one short read.
    """
    layer = get_channel_layer()
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + seconds
    channel = await layer.new_channel() if layer is not None else None
    group = notify.run_group(run_pk)
    if channel is not None:
        await layer.group_add(group, channel)
    receiving: asyncio.Future | None = None
    try:
        result = await read()
        last_read = loop.time()
        while not satisfied(result):
            now = loop.time()
            if now >= deadline:
                break
            await ctx.report_progress(round(now - started, 1), seconds, f"waiting for {label}")
            tick = min(PROGRESS_SECONDS, deadline - now)
            if channel is None:
                await asyncio.sleep(tick)
                rang = False
            else:
                if receiving is None:
                    receiving = asyncio.ensure_future(layer.receive(channel))
                done, _ = await asyncio.wait({receiving}, timeout=tick)
                rang = bool(done)
                if rang:
                    receiving = None
            if rang or loop.time() - last_read >= RECHECK_SECONDS or loop.time() >= deadline:
                result = await read()
                last_read = loop.time()
        return result
    finally:
        if receiving is not None:
            receiving.cancel()
        if channel is not None:
            await layer.group_discard(group, channel)


def _wait_seconds(value: float | None) -> float:
    if value is None:
        return 0.0
    if not 0 <= value <= settings.MCP_MAX_WAIT_SECONDS:
        raise RpcError(
            INVALID_PARAMS,
            f"waitSeconds: must be between 0 and {settings.MCP_MAX_WAIT_SECONDS}, got {value}",
        )
    return float(value)


# --- the services each tool calls --------------------------------------------------------


def _delegate(run_caller: RunCaller, caller: Caller, request: dict) -> dict:
    return children.start_child(caller, _params(run_caller, request=request))


def _read(run_caller: RunCaller, caller: Caller, child_id: str, after: int | None) -> dict:
    return children.read_child(caller, _params(run_caller, childId=child_id, after=after))


def _cancel(run_caller: RunCaller, caller: Caller, child_id: str) -> dict:
    return children.cancel_child(caller, _params(run_caller, childId=child_id))


def _steer(run_caller: RunCaller, caller: Caller, child_id: str, message, request_id) -> dict:
    params = _params(run_caller, childId=child_id, message=message, requestId=request_id)
    return children.steer_child(caller, params)


def _run_pk_of(run_id: str) -> int | None:
    from delegation.models import Run

    return Run.objects.filter(run_id=run_id).values_list("pk", flat=True).first()


def _profiles(run_caller: RunCaller, caller: Caller) -> dict:
    run = run_tokens.run_of(run_caller)
    level = caller.level_of(run)
    presets = ExtensionPreset.objects.filter(
        runner_id=run_caller.runner_pk, extension_id=run_caller.extension_id
    ).order_by("name")
    may_spawn = depthlib.may_spawn(level, settings.DELEGATION_MAX_DEPTH)
    return {
        "extensionId": run_caller.extension_id,
        "depth": level,
        "maxDepth": settings.DELEGATION_MAX_DEPTH,
        "maySpawn": may_spawn,
        "profiles": [
            {"name": p.name, "systemPrompt": p.system_prompt, "options": p.options or {}}
            for p in presets
        ]
        if may_spawn
        else [],
    }


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


def build_server() -> MCPServer:
    server = MCPServer(
        "canopy",
        instructions=(
            "Canopy runs your subagents (children). delegate starts one with a profile from "
            "list_profiles; read_child follows its events and result; steer_child sends it a "
            "message; cancel_child stops it. Delegation depth is capped: when a call is refused "
            "with code -32010, do the work yourself."
        ),
    )

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
            wait = _wait_seconds(waitSeconds)
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
            result = await _run(_delegate, ctx, request)
            if wait and not result["done"]:
                result = await _wait_done(ctx, result, wait)
            return _ok(result)
        except RpcError as error:
            return _refused(error)

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
            wait = _wait_seconds(waitSeconds)
            result = await _run(_read, ctx, childId, after)
            if wait and not result["events"] and not result["done"]:
                run_pk = await database_sync_to_async(_run_pk_of)(result["runId"])
                result = await _wait_until(
                    ctx,
                    run_pk,
                    wait,
                    f"child {childId}",
                    lambda: _run(_read, ctx, childId, after),
                    lambda r: bool(r["events"]) or r["done"],
                )
            return _ok(result)
        except RpcError as error:
            return _refused(error)

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
            answer = await _run(_steer, ctx, childId, message, requestId or _new_request_id())
            return _ok({"outcome": answer["outcome"], "reason": answer.get("reason", "")})
        except RpcError as error:
            return _refused(error)

    @server.tool(
        name="cancel_child",
        description=(
            "Cancel one of your children (and its own children). Answers at once with its "
            "Result; `done` and `cancelled` become true once it has stopped."
        ),
    )
    async def cancel_child(ctx: Context, childId: CHILD_ID) -> CallToolResult:  # noqa: N803
        try:
            return _ok(await _run(_cancel, ctx, childId))
        except RpcError as error:
            return _refused(error)

    @server.tool(
        name="list_profiles",
        description=(
            "The profiles (presets) you may start children with, your delegation depth and the "
            "maximum; `maySpawn` false means delegate will be refused: do the work yourself."
        ),
    )
    async def list_profiles(ctx: Context) -> CallToolResult:
        try:
            return _ok(await _run(_profiles, ctx))
        except RpcError as error:
            return _refused(error)

    return server


def _new_request_id() -> str:
    import uuid

    return f"mcp-{uuid.uuid4().hex}"


async def _wait_done(ctx: Context, result: dict, seconds: float) -> dict:
    run_pk = await database_sync_to_async(_run_pk_of)(result["runId"])
    child_id = result["conversationId"]
    # Events stay with read_child (paged); delegate answers with the child's state.
    latest = await _wait_until(
        ctx,
        run_pk,
        seconds,
        f"child {child_id}",
        lambda: _run(_state, ctx, child_id),
        lambda r: r["done"],
    )
    return latest


def _state(run_caller: RunCaller, caller: Caller, child_id: str) -> dict:
    # Past any sequence: the same ownership checks as read_child, without reading a page.
    return _read(run_caller, caller, child_id, sys.maxsize)


# --- the ASGI door -----------------------------------------------------------------------


class McpGate:
    """Routes ``/mcp`` to the MCP SDK and everything else to ``app``; handles ASGI lifespan.

    Channels' ``ProtocolTypeRouter`` refuses lifespan, and the SDK's session manager must be
    running before it serves a request. A server that sends lifespan (uvicorn) starts and
    stops it here; daphne sends none, so the first ``/mcp`` request starts it.
    """

    def __init__(self, app):
        self.app = app
        self.server = build_server()
        self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            # The bearer run token is the protection; Host/Origin are Django's business
            # (ALLOWED_HOSTS) for the pages, and agents send no Origin.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.manager = self.server.session_manager
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "http" and scope["path"].rstrip("/") == MCP_PATH:
            await self._mcp(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._start()
                except Exception as exc:  # pragma: no cover - reported to the server
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self):
        if self._ready is None:
            self._ready = asyncio.Event()
            self._stop = asyncio.Event()
            self._task = asyncio.ensure_future(self._serve())
        await self._ready.wait()

    async def _serve(self):
        async with self.manager.run():
            self._ready.set()
            await self._stop.wait()

    async def _shutdown(self):
        if self._stop is not None and self._task is not None:
            self._stop.set()
            await self._task

    async def _mcp(self, scope, receive, send):
        upkeep.ensure_started()
        token = bearer_token(scope.get("headers", []))
        caller = await database_sync_to_async(run_tokens.authenticate_run_token)(token or "")
        if caller is None:
            await _unauthorized(send)
            return
        await self._start()
        await self.manager.handle_request(scope, receive, send)


async def _unauthorized(send):
    body = json.dumps(
        {
            "error": {
                "code": 401,
                "message": "a live run token is required: Authorization: Bearer <run token>",
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"www-authenticate", b'Bearer realm="canopy-mcp"'),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

"""The ``acp`` engine: every child is an Agent Client Protocol agent process (SPEC §9).

Per child the engine starts the preset's command (``claude-code-acp``, ``codex-acp``,
``gemini --experimental-acp``, ``goose acp``, ...) in its own process group, with the same
environment rules as the ``command`` engine, and drives it as the ACP *client* with the
``agent-client-protocol`` package:

- ``initialize``, then ``session/new`` with the child's cwd and, when the runner has them,
  Canopy's MCP server (http, the run token and ``X-Pando-Delegation-Depth`` as headers) in
  ``mcpServers``; ``session/prompt`` with the message;
- ``session/update`` notifications become events: message and thought chunks are coalesced
  into one ``text`` / ``thinking`` event per message, tool calls become ``tool-use`` and
  their updates ``tool-update`` / ``tool-result`` with the agent's ids and status, plans
  ``plan``, ``usage_update`` (and a turn's own usage) ``usage``;
- a steer during a turn is queued and sent as the next ``session/prompt`` when the turn ends
  (``injected``); once the session has ended it is ``promptRequired``;
- a cancel sends ``session/cancel``, waits the preset's grace for the turn to end, then stops
  the process (SIGTERM to its group, SIGKILL after the grace);
- permission requests are answered by the preset's policy: tool kinds on its allow-list are
  allowed once, everything else is rejected; each decision is a ``permission`` event;
- a resumed child (``request.resume``) is ``session/load``-ed when the agent offers it and this
  runner knows the agent's session id for that conversation; otherwise the run fails with a
  reason saying which of the two is missing.

The run token comes from the server (``run.mcpToken``); a server that gives none (an older
one, without ``/mcp``) leaves the agent without Canopy's tools, said in an ``error`` event. The
``mcp`` argument replaces how the token is obtained (tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, RequestError, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    HttpHeader,
    HttpMcpServer,
    Implementation,
    RequestPermissionResponse,
)

from delegation import depth as depthlib
from delegation import errors as codes
from delegation.client import ClientError, Preset, RpcError, event
from delegation.runner import mcpconfig
from delegation.runner.command import PASSED_ENV, confine
from delegation.runner.formats import COALESCE_BYTES, clip, usage_event
from delegation.runner.host import Outcome, RunContext

log = logging.getLogger("canopy.runner.acp")

TOOL_KINDS = (
    "read",
    "edit",
    "delete",
    "move",
    "search",
    "execute",
    "think",
    "fetch",
    "switch_mode",
    "other",
)
STDERR_TAIL = 20
# Coalesced chunks wait at most this long, so a slow message still shows up while it grows.
CHUNK_MAX_AGE = 0.5
# ACP frames (one JSON-RPC message per line) may carry whole files.
STREAM_LIMIT = 50 * 1024 * 1024

McpProvider = mcpconfig.McpProvider


class AcpRefused(Exception):
    """The agent cannot do what the run needs (e.g. no ``session/load`` for a resume)."""


@dataclass
class AcpPreset:
    name: str
    command: list[str]
    system_prompt: str = ""
    options: Mapping[str, Any] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    cancel_grace: float = 5.0
    allow_tool_kinds: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> AcpPreset:
        known = {
            "name",
            "command",
            "systemPrompt",
            "options",
            "env",
            "cwd",
            "cancelGraceSeconds",
            "allowToolKinds",
        }
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"acp preset: unknown field(s) {', '.join(sorted(unknown))}")
        name = raw.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ValueError("acp preset: 'name' must be a non-blank string")
        command = raw.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(a, str) for a in command)
        ):
            raise ValueError(f"acp preset {name!r}: 'command' must be a non-empty list of strings")
        env = raw.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError(f"acp preset {name!r}: 'env' must map names to strings")
        grace = raw.get("cancelGraceSeconds", 5.0)
        if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
            raise ValueError(f"acp preset {name!r}: 'cancelGraceSeconds' must be a number >= 0")
        kinds = raw.get("allowToolKinds", [])
        if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
            raise ValueError(f"acp preset {name!r}: 'allowToolKinds' must be a list of strings")
        bad = [k for k in kinds if k not in TOOL_KINDS]
        if bad:
            raise ValueError(
                f"acp preset {name!r}: 'allowToolKinds' has unknown kind(s) {', '.join(bad)} "
                f"(ACP tool kinds: {', '.join(TOOL_KINDS)})"
            )
        return cls(
            name=name,
            command=command,
            system_prompt=raw.get("systemPrompt", "") or "",
            options=raw.get("options"),
            env=env,
            cwd=raw.get("cwd"),
            cancel_grace=float(grace),
            allow_tool_kinds=tuple(kinds),
        )


def _content_text(content: Any) -> str:
    """Readable text of ACP content: a content block, or a list of tool call contents."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "\n".join(filter(None, (_content_text(c) for c in content)))
    kind = getattr(content, "type", None)
    if kind == "text":
        return content.text
    if kind == "content":  # a tool call's content wrapper
        return _content_text(content.content)
    if kind == "diff":
        return f"diff of {content.path}"
    if kind == "terminal":
        return f"terminal {content.terminal_id}"
    if kind == "resource_link":
        return content.uri
    if kind in ("image", "audio"):
        return f"[{kind}]"
    if kind == "resource":
        return getattr(content.resource, "text", None) or getattr(content.resource, "uri", "")
    return json.dumps(_dump(content), ensure_ascii=False, default=str)


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value


class Session:
    """One child's ACP client side: session updates in, events out, permissions decided."""

    def __init__(self, ctx: RunContext, preset: AcpPreset, queue: asyncio.Queue):
        self.ctx = ctx
        self.preset = preset
        self.queue = queue
        self.session_id = ""
        self.replaying = False  # session/load replays history: not this run's events
        self.chunks: list[str] = []
        self.chunk_kind: str | None = None
        self.chunk_message: str | None = None
        self.chunk_bytes = 0
        self.chunk_since = 0.0
        # The agent's message text of the current turn, split where something else (a tool
        # call, a thought, a plan) or a new messageId came between: the last part is the
        # turn's answer.
        self.turn_parts: list[list[str]] = []
        self.part_open = False
        self.last_message_id: str | None = None
        self.tool_names: dict[str, str] = {}
        self.cost_seen = 0.0
        self.cancelling = False

    # -- events ------------------------------------------------------------------------

    def put(self, *events: dict) -> None:
        for ev in events:
            self.queue.put_nowait(clip(ev))

    def flush(self) -> None:
        if not self.chunks:
            return
        text = "".join(self.chunks)
        kind = self.chunk_kind or "text"
        self.chunks, self.chunk_kind, self.chunk_message, self.chunk_bytes = [], None, None, 0
        self.put(event(kind, text))

    def flush_stale(self) -> None:
        if self.chunks and time.monotonic() - self.chunk_since >= CHUNK_MAX_AGE:
            self.flush()

    def _chunk(self, kind: str, text: str, message_id: str | None) -> None:
        if self.chunk_kind != kind or (message_id and message_id != self.chunk_message):
            self.flush()
        if not self.chunks:
            self.chunk_since = time.monotonic()
        self.chunk_kind = kind
        self.chunk_message = message_id or self.chunk_message
        self.chunks.append(text)
        self.chunk_bytes += len(text.encode("utf-8"))
        if message_id and message_id != self.last_message_id:
            self.part_open = False  # a new message starts a new part of the answer
        self.last_message_id = message_id or self.last_message_id
        if kind == "text":
            if not self.part_open:
                self.turn_parts.append([])
                self.part_open = True
            self.turn_parts[-1].append(text)
        else:
            self.part_open = False
        if self.chunk_bytes >= COALESCE_BYTES:
            self.flush()

    # -- the ACP Client interface ------------------------------------------------------

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        # Everything below is synchronous: notifications are handled in tasks started in
        # arrival order, so doing the work before any await keeps the events in order.
        if self.replaying:
            return
        kind = getattr(update, "session_update", None)
        if kind in ("agent_message_chunk", "agent_thought_chunk", "user_message_chunk"):
            event_kind = {
                "agent_message_chunk": "text",
                "agent_thought_chunk": "thinking",
                "user_message_chunk": "user",
            }[kind]
            self._chunk(event_kind, _content_text(update.content), update.message_id)
            return
        self.flush()
        self.part_open = False
        if kind == "tool_call":
            self._tool_call(update)
        elif kind == "tool_call_update":
            self._tool_update(update)
        elif kind == "plan":
            entries = [
                {"content": e.content, "priority": e.priority, "status": e.status}
                for e in update.entries
            ]
            marks = {"completed": "x", "in_progress": "~"}
            lines = [f"[{marks.get(e['status'], ' ')}] {e['content']}" for e in entries]
            self.put(event("plan", "\n".join(lines), input={"entries": entries}))
        elif kind == "usage_update":
            self._usage_update(update)
        elif kind == "current_mode_update":
            self.put(event("mode", update.current_mode_id))
        # available_commands_update, config_option_update, session_info_update: agent UI
        # state with nothing to show on a run's stream.

    def _tool_call(self, update: Any) -> None:
        call_id = update.tool_call_id
        if call_id in self.tool_names:
            # Some agents (claude-code-acp) announce a call again once its input is complete:
            # one tool-use per call, the rest are updates.
            self._tool_update(update)
            return
        self.tool_names[call_id] = update.title
        args = update.raw_input if update.raw_input is not None else {}
        self.put(
            event(
                "tool-use",
                update.kind or None,
                tool_name=update.title,
                tool_call_id=call_id,
                input=args,
            )
        )
        if update.status in ("completed", "failed"):
            self._tool_update(update)

    def _tool_update(self, update: Any) -> None:
        call_id = update.tool_call_id
        if update.title:
            self.tool_names[call_id] = update.title  # titles get more specific as input arrives
        name = self.tool_names.get(call_id) or update.title
        text = _content_text(update.content)
        output = update.raw_output if update.raw_output is not None else (text or None)
        if update.status == "completed":
            self.put(
                event(
                    "tool-result",
                    tool_name=name,
                    tool_call_id=call_id,
                    tool_output=output,
                    success=True,
                )
            )
        elif update.status == "failed":
            self.put(
                event(
                    "tool-result",
                    tool_name=name,
                    tool_call_id=call_id,
                    tool_output=output,
                    success=False,
                    error=text or "the tool call failed",
                )
            )
        elif update.status or output is not None or update.raw_input is not None or update.title:
            self.put(
                event(
                    "tool-update",
                    update.status,
                    tool_name=name,
                    tool_call_id=call_id,
                    input=update.raw_input,
                    tool_output=output,
                )
            )
        # An update with nothing in it (no status, input, output or title) shows nothing.

    def _usage_update(self, update: Any) -> None:
        # usage_update carries the context window and the session's cumulative cost; a usage
        # event adds to the run's totals, so only the cost spent since the last one counts.
        cost = update.cost
        delta = None
        if cost is not None and cost.currency.upper() == "USD" and cost.amount >= self.cost_seen:
            delta = cost.amount - self.cost_seen
            self.cost_seen = cost.amount
        if not delta:
            return  # only the context window moved: nothing to add to the run's totals
        used = usage_event(0, 0, cost_usd=delta)
        if used is not None:
            used["text"] = f"context {update.used}/{update.size} tokens" + (
                f", ${delta:.4f}" if delta else ""
            )
            self.put(used)

    def turn_usage(self, usage: Any) -> None:
        if usage is None:
            return
        used = usage_event(
            usage.input_tokens,
            usage.output_tokens,
            cache_read=usage.cached_read_tokens,
            cache_write=usage.cached_write_tokens,
        )
        if used is not None:
            self.put(used)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list, **kwargs: Any
    ) -> RequestPermissionResponse:
        self.flush()
        kind = tool_call.kind or "other"
        name = tool_call.title or self.tool_names.get(tool_call.tool_call_id) or ""
        allowed = kind in self.preset.allow_tool_kinds and not self.cancelling
        wanted = ("allow_once", "allow_always") if allowed else ("reject_once", "reject_always")
        option = next((o for w in wanted for o in options if o.kind == w), None)
        if self.cancelling:
            option = None  # ACP: pending permission requests of a cancelled turn are cancelled
        if self.cancelling:
            reason = "the run is being cancelled"
        elif allowed:
            reason = f"tool kind {kind!r} is allowed by preset {self.preset.name!r}"
        else:
            reason = f"tool kind {kind!r} is not on preset {self.preset.name!r}'s allow-list"
        decision = "allowed" if allowed and option is not None else "denied"
        self.put(
            event(
                "permission",
                f"{decision}: {reason}",
                tool_name=name or None,
                tool_call_id=tool_call.tool_call_id,
                input={
                    "toolKind": kind,
                    "decision": decision,
                    "option": option.option_id if option else None,
                    "options": [o.option_id for o in options],
                },
                success=decision == "allowed",
            )
        )
        if option is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=option.option_id)
        )

    # The runner offers the agent no file system and no terminal (it advertises neither),
    # so these are refused if an agent calls them anyway.
    async def read_text_file(self, *args: Any, **kwargs: Any):
        raise RequestError.method_not_found("fs/read_text_file")

    async def write_text_file(self, *args: Any, **kwargs: Any):
        raise RequestError.method_not_found("fs/write_text_file")

    async def create_terminal(self, *args: Any, **kwargs: Any):
        raise RequestError.method_not_found("terminal/create")

    async def ext_method(self, method: str, params: dict) -> dict:
        raise RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict) -> None:
        return None

    def on_connect(self, conn: Any) -> None:
        return None


class AcpEngine:
    name = "acp"

    def __init__(
        self,
        presets: list[AcpPreset],
        workspace: str,
        *,
        mcp: McpProvider | None = None,
    ):
        if not presets:
            raise ValueError("the acp engine needs at least one preset")
        names = [p.name for p in presets]
        if len(set(names)) != len(names):
            raise ValueError("duplicate preset names")
        self.presets_by_name = {p.name: p for p in presets}
        self.workspace = str(Path(workspace).resolve())
        self.mcp = mcp
        # session/cancel grace, then SIGTERM grace, before the host tears the run down.
        self.cancel_grace = 2 * max(p.cancel_grace for p in presets) + 2.0
        # conversationId -> the agent's session id, for session/load on a resume.
        self.sessions: dict[str, str] = {}
        # conversationId -> the session's cumulative cost reported so far: a loaded session
        # keeps counting from there, and only what is new adds to the resumed run's totals.
        self.costs: dict[str, float] = {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], workspace: str | None = None, **kwargs):
        presets = [AcpPreset.from_config(p) for p in config["presets"]]
        return cls(presets, workspace or config.get("workspace") or os.getcwd(), **kwargs)

    def presets(self) -> list[Preset]:
        return [
            Preset(p.name, p.system_prompt, dict(p.options) if p.options else None)
            for p in self.presets_by_name.values()
        ]

    def check(self, command, host) -> None:
        preset = self.presets_by_name.get(command.preset.name)
        if preset is None:
            raise RpcError(
                codes.INVALID_PARAMS, f"preset {command.preset.name!r} has no ACP agent here"
            )
        try:
            confine(self.workspace, command.request.get("cwd") or preset.cwd)
        except ValueError as exc:
            raise RpcError(codes.INVALID_PARAMS, f"request.cwd: {exc}") from None

    def environment(self, ctx: RunContext, preset: AcpPreset, cwd: str) -> dict[str, str]:
        # The command engine's allow-list: none of the runner's own environment (its token,
        # server secrets) reaches the agent.
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(preset.env)
        env.update(
            {
                "CANOPY_RUN_ID": ctx.run_id,
                "CANOPY_CONVERSATION_ID": ctx.conversation_id,
                "CANOPY_PROFILE": preset.name,
                "CANOPY_WORKSPACE": self.workspace,
                "CANOPY_CWD": cwd,
            }
        )
        return depthlib.child_env(ctx.depth, env)

    async def mcp_servers(self, ctx: RunContext, session: Session) -> list[HttpMcpServer]:
        try:
            found = await (self.mcp or mcpconfig.run_token)(ctx)
        except (RpcError, ClientError) as exc:
            # The agent can still do its work, only not delegate: say so on the run.
            session.put(event("error", error=f"no Canopy MCP server for this agent: {exc}"))
            return []
        if not found:
            return []
        token = mcpconfig.as_token(found)
        ctx.data["run_token"] = token.token
        headers = [
            HttpHeader(name=k, value=v) for k, v in mcpconfig.headers(token, ctx.depth).items()
        ]
        return [
            HttpMcpServer(type="http", name=mcpconfig.SERVER_NAME, url=token.url, headers=headers)
        ]

    # -- one child ---------------------------------------------------------------------

    async def run(self, ctx: RunContext) -> Outcome:
        preset = self.presets_by_name[ctx.preset.name if ctx.preset else ctx.profile]
        cwd = confine(self.workspace, ctx.cwd or preset.cwd)
        process = await asyncio.create_subprocess_exec(
            *preset.command,
            cwd=cwd,
            env=self.environment(ctx, preset, cwd),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: stopping it reaches its children
            limit=STREAM_LIMIT,
        )
        ctx.data["process"] = process
        ctx.data["pid"] = process.pid
        ctx.data["acp_done"] = False
        queue: asyncio.Queue = asyncio.Queue()
        session = Session(ctx, preset, queue)
        ctx.data["acp_session"] = session
        stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL)
        sender = asyncio.create_task(self._send(ctx, queue))
        stderr = asyncio.create_task(self._stderr(process, stderr_tail, ctx))
        ticker = asyncio.create_task(self._tick(session))
        conn = ClientSideConnection(session, process.stdin, process.stdout)
        try:
            outcome = await self._drive(ctx, preset, session, conn, cwd)
        except AcpRefused as exc:
            outcome = Outcome(error=str(exc))
        except (ConnectionError, RequestError) as exc:
            detail = str(exc)
            data = getattr(exc, "data", None)
            if data:
                detail += f" ({json.dumps(data, ensure_ascii=False, default=str)[:500]})"
            # The agent's last line that says something (not a brace of a logged object).
            said = [line for line in stderr_tail if sum(c.isalpha() for c in line) >= 8]
            if said:
                detail += f"; stderr: {said[-1][:500]}"
            if process.returncode is not None:
                detail = f"the agent exited with status {process.returncode}: {detail}"
            outcome = Outcome(error=f"ACP agent failed: {detail}")
        finally:
            ctx.data["acp_done"] = True
            session.flush()
            self.costs[ctx.conversation_id] = session.cost_seen
            with contextlib.suppress(Exception):
                await conn.close()
            await self._stop(process, preset.cancel_grace)
            stderr.cancel()
            ticker.cancel()
            session.flush()
            queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await sender
        if ctx.cancelled:
            return Outcome(cancelled=True)
        return outcome

    async def _drive(self, ctx, preset, session: Session, conn, cwd: str) -> Outcome:
        init = await self._until_cancel(
            ctx,
            conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=ClientCapabilities(),
                client_info=Implementation(name="canopy", title="Canopy", version="0.1.0"),
            ),
        )
        if init is None:
            return Outcome(cancelled=True)
        capabilities = init.agent_capabilities
        servers = await self.mcp_servers(ctx, session)
        resume = ctx.request.get("resume") if isinstance(ctx.request, Mapping) else None
        if resume:
            known = self.sessions.get(ctx.conversation_id)
            if not (capabilities and capabilities.load_session):
                raise AcpRefused(
                    f"resume: preset {preset.name!r}'s ACP agent does not offer session/load"
                )
            if not known:
                raise AcpRefused(
                    f"resume: this runner has no ACP session recorded for {ctx.conversation_id!r}"
                )
            session.replaying = True
            loaded = await self._until_cancel(
                ctx, conn.load_session(cwd=cwd, session_id=known, mcp_servers=servers)
            )
            session.replaying = False
            if ctx.cancelled:
                return Outcome(cancelled=True)
            del loaded
            session.session_id = known
            session.cost_seen = self.costs.get(ctx.conversation_id, 0.0)
            session.put(event("session", f"ACP session {known} loaded", input={"sessionId": known}))
        else:
            created = await self._until_cancel(ctx, conn.new_session(cwd=cwd, mcp_servers=servers))
            if created is None:
                return Outcome(cancelled=True)
            session.session_id = created.session_id
            agent = init.agent_info.name if init.agent_info else preset.command[0]
            session.put(
                event(
                    "session",
                    f"ACP session {created.session_id} started ({agent})",
                    input={"sessionId": created.session_id, "agent": agent},
                )
            )
        self.sessions[ctx.conversation_id] = session.session_id
        system = (ctx.preset.system_prompt if ctx.preset else "") or preset.system_prompt
        blocks = [text_block(system), text_block(ctx.message)] if system else None
        prompt = blocks or [text_block(ctx.message)]
        while True:
            session.turn_parts, session.part_open = [], False
            response = await self._turn(ctx, session, conn, prompt, preset.cancel_grace)
            session.flush()
            if response is None:
                return Outcome(cancelled=True)
            session.turn_usage(response.usage)
            reason = response.stop_reason
            if reason == "cancelled" or ctx.cancelled:
                return Outcome(cancelled=True)
            if reason == "refusal":
                session.put(event("error", error="the agent refused to continue"))
                return Outcome(error="the agent refused to continue (stopReason refusal)")
            if reason in ("max_tokens", "max_turn_requests"):
                message = f"the agent stopped: {reason}"
                session.put(event("error", error=message))
                return Outcome(error=message)
            steers = ctx.take_steers()
            if not steers:
                # No await between this check and the flag: a steer either made it into the
                # queue above or sees the session ended.
                ctx.data["acp_done"] = True
                output = "".join(session.turn_parts[-1]) if session.turn_parts else ""
                session.put(event("result", output))
                return Outcome(output=output)
            prompt = [text_block("\n\n".join(steers))]

    async def _until_cancel(self, ctx: RunContext, awaitable):
        """``awaitable``'s result, or None if the run is cancelled first."""
        task = asyncio.ensure_future(awaitable)
        cancel = asyncio.create_task(ctx.cancel_event.wait())
        try:
            await asyncio.wait([task, cancel], return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel.cancel()
        if task.done():
            return task.result()
        task.cancel()
        return None

    async def _turn(self, ctx, session: Session, conn, prompt, grace: float):
        task = asyncio.ensure_future(conn.prompt(session_id=session.session_id, prompt=prompt))
        cancel = asyncio.create_task(ctx.cancel_event.wait())
        try:
            await asyncio.wait([task, cancel], return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel.cancel()
        if task.done():
            return task.result()
        session.cancelling = True
        with contextlib.suppress(Exception):
            await conn.cancel(session_id=session.session_id)
        # The agent should answer the prompt with stopReason "cancelled"; one that does not is
        # stopped by the caller after this grace.
        done, _ = await asyncio.wait([task], timeout=grace)
        if not done:
            task.cancel()
            return None
        with contextlib.suppress(Exception):
            return task.result()
        return None

    async def steer(self, ctx: RunContext, message: str) -> str:
        """Queue the steer for the next prompt; ``promptRequired`` once the session ended."""
        if ctx.data.get("acp_done") or ctx.cancelled:
            return "promptRequired"
        ctx.steers.put_nowait(message)
        return "injected"

    async def _send(self, ctx: RunContext, queue: asyncio.Queue) -> None:
        done = False
        while not done:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            if batch[-1] is None:
                batch.pop()
                done = True
            batch = [ev for ev in batch if ev is not None]
            if batch:
                await ctx.emit(*batch)

    async def _tick(self, session: Session) -> None:
        while True:
            await asyncio.sleep(CHUNK_MAX_AGE / 2)
            session.flush_stale()

    async def _stderr(self, process, tail: deque, ctx: RunContext) -> None:
        while True:
            try:
                raw = await process.stderr.readline()
            except ValueError:
                continue
            if not raw:
                return
            line = mcpconfig.redact(
                raw.decode("utf-8", errors="replace").rstrip(), ctx.data.get("run_token")
            )
            if line:
                tail.append(line)
                log.debug("acp agent %s: %s", process.pid, line)

    async def _stop(self, process, grace: float) -> None:
        """End the agent: close its stdin, then SIGTERM its group, then SIGKILL."""
        if process.stdin is not None:
            with contextlib.suppress(Exception):
                process.stdin.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.2):
                await process.wait()
        if process.returncode is None:
            _kill_group(process.pid, signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    await process.wait()
            except TimeoutError:
                log.info("acp agent %s ignored SIGTERM for %.1fs; killing it", process.pid, grace)
        # Whatever the agent started in its group goes too.
        _kill_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await process.wait()


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)

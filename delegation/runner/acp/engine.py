"""The engine: starts one ACP agent process per child and drives its session (see the
package docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Mapping

from acp import PROTOCOL_VERSION, RequestError, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import ClientCapabilities, HttpHeader, HttpMcpServer, Implementation

from delegation.client import ClientError, McpToken, RpcError, event
from delegation.runner import fork, mcpconfig
from delegation.runner import process as proc
from delegation.runner.acp import forks
from delegation.runner.acp.presets import AcpPreset, AcpRefused
from delegation.runner.acp.session import CHUNK_MAX_AGE, Session
from delegation.runner.host import Outcome, RunContext
from delegation.runner.presets import PresetEngine, confine
from delegation.runner.sandbox import PrivateHome

log = logging.getLogger("canopy.runner.acp")
STDERR_TAIL = 20
# ACP frames (one JSON-RPC message per line) may carry whole files.
STREAM_LIMIT = 50 * 1024 * 1024

McpProvider = mcpconfig.McpProvider


class AcpEngine(PresetEngine):
    name = "acp"
    preset_class = AcpPreset
    missing = "has no ACP agent here"
    # SPEC §14: run.pause / run.resume stop and continue the agent's processes.
    pause = staticmethod(proc.pause_run)
    resume = staticmethod(proc.resume_run)

    def __init__(self, presets: list[AcpPreset], workspace: str, *, mcp: McpProvider | None = None):
        super().__init__(presets, workspace, mcp=mcp)
        # session/cancel grace, then SIGTERM grace, before the host tears the run down.
        self.cancel_grace = 2 * max(p.cancel_grace for p in presets) + 2.0
        # conversationId -> the agent's session id, for session/load on a resume.
        self.sessions: dict[str, str] = {}
        # conversationId -> the session's cumulative cost reported so far: a loaded session
        # keeps counting from there, and only what is new adds to the resumed run's totals.
        self.costs: dict[str, float] = {}

    def environment(self, ctx: RunContext, preset: AcpPreset, cwd: str) -> dict[str, str]:
        identity = {
            "CANOPY_RUN_ID": ctx.run_id,
            "CANOPY_CONVERSATION_ID": ctx.conversation_id,
            "CANOPY_PROFILE": preset.name,
            "CANOPY_WORKSPACE": self.workspace,
            "CANOPY_CWD": cwd,
        }
        return proc.environment(preset, preset.env, identity, ctx.depth)

    async def run_token(self, ctx: RunContext) -> tuple[McpToken | None, str]:
        """The run's MCP token (None without one), and why there is none when asking failed.

        Asked before the agent starts, so that an ``env`` preset can hand it over in the
        agent's environment rather than on anything a process's argv may carry."""
        try:
            found = await (self.mcp or mcpconfig.run_token)(ctx)
        except (RpcError, ClientError) as exc:
            return None, f"no Canopy MCP server for this agent: {exc}"
        if not found:
            return None, ""
        token = mcpconfig.as_token(found)
        ctx.data["run_token"] = token.token
        mcpconfig.LIVE_TOKENS.add(token.token)
        return token, ""

    def mcp_servers(
        self, ctx: RunContext, preset: AcpPreset, token: McpToken | None
    ) -> list[HttpMcpServer]:
        if token is None:
            return []
        values = mcpconfig.headers(token, ctx.depth)
        if preset.mcp_token_via == "env":
            # The agent expands the variable from its environment (see AcpPreset).
            values["Authorization"] = "Bearer ${" + mcpconfig.CODEX_TOKEN_ENV + "}"
        headers = [HttpHeader(name=k, value=v) for k, v in values.items()]
        return [
            HttpMcpServer(type="http", name=mcpconfig.SERVER_NAME, url=token.url, headers=headers)
        ]

    # -- one child ---------------------------------------------------------------------

    def can_fork(self, preset: AcpPreset) -> bool:
        return preset.can_fork

    async def run(self, ctx: RunContext) -> Outcome:
        preset = self.preset_of(ctx)
        if ctx.fork_from:
            # Fork from here resumes a transcript the command engine kept (Claude Code's);
            # never a fresh start that looks like a fork.
            return Outcome(error=f"fork from here: preset {preset.name} is not Claude Code")
        cwd = confine(self.workspace, ctx.cwd or preset.cwd)
        home = PrivateHome(preset) if preset.sandboxed else None
        ctx.data["private_home"], ctx.data["cwd"] = home, cwd
        try:
            return mcpconfig.redact_outcome(await self._run(ctx, preset, cwd, home))
        finally:
            mcpconfig.LIVE_TOKENS.discard(ctx.data.get("run_token"))
            if home is not None:
                home.remove()

    async def _run(self, ctx, preset: AcpPreset, cwd: str, home: PrivateHome | None) -> Outcome:
        token, problem = await self.run_token(ctx)
        env = self.environment(ctx, preset, cwd)
        if token is not None and preset.mcp_token_via == "env":
            env[mcpconfig.CODEX_TOKEN_ENV] = token.token
        queue: asyncio.Queue = asyncio.Queue()
        process = await proc.spawn(
            preset,
            list(preset.command),
            workspace=self.workspace,
            cwd=cwd,
            env=env,
            limit=STREAM_LIMIT,
            home=home,
            mcp_url=token.url if token is not None else None,
            on_refusal=lambda text: queue.put_nowait(proc.refusal_event(text)),
        )
        ctx.data["process"] = process
        ctx.data["pid"] = process.pid
        if ctx.paused:
            proc.pause(process)
        ctx.data["acp_done"] = False
        session = Session(ctx, preset, queue)
        ctx.data["acp_session"] = session
        if problem:
            # The agent can still do its work, only not delegate: say so on the run.
            session.put(event("error", error=problem))
        stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL)
        sender = asyncio.create_task(proc.send_batches(ctx, queue))
        stderr = asyncio.create_task(self._stderr(process, stderr_tail, ctx))
        ticker = asyncio.create_task(self._tick(session))
        conn = ClientSideConnection(session, process.stdin, process.stdout)
        try:
            servers = self.mcp_servers(ctx, preset, token)
            outcome = await self._drive(ctx, preset, session, conn, cwd, servers)
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
            await proc.stop(process, preset.cancel_grace)
            stderr.cancel()
            ticker.cancel()
            session.flush()
            queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await sender
        if ctx.cancelled:
            return Outcome(cancelled=True)
        return outcome

    async def _drive(self, ctx, preset, session: Session, conn, cwd: str, servers) -> Outcome:
        # The ACP conversation in protocol order (initialize, session/new, prompt, steer
        # turns, outcome); each step is short and reads best in sequence.
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
            if fork.wants_fork(ctx):
                parent = await forks.prepare(ctx, preset, capabilities, cwd)
                opening = conn.fork_session(session_id=parent, cwd=cwd, mcp_servers=servers)
            else:
                opening = conn.new_session(cwd=cwd, mcp_servers=servers)
            created = await self._until_cancel(ctx, opening)
            if created is None:
                return Outcome(cancelled=True)
            session.session_id = created.session_id
            agent = init.agent_info.name if init.agent_info else preset.command[0]
            how = f"forked from {parent}" if fork.wants_fork(ctx) else "started"
            session.put(
                event(
                    "session",
                    f"ACP session {created.session_id} {how} ({agent})",
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

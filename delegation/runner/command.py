"""The ``command`` engine: every child runs a configured command line as a subprocess.

This is how an operator wraps a real CLI agent. Per preset, a configuration names the command
line; for each child the engine:

- starts the command in its own process group, with ``PANDO_DELEGATION_DEPTH`` set to the
  child's depth (so an agent that spawns its own subagents keeps the cap), the child's identity
  in ``CANOPY_*`` variables, and otherwise only ``PATH``, ``HOME``, ``LANG``, ``TERM`` and the
  preset's ``env``: none of the runner's own environment (its token, server secrets);
- optionally inside bubblewrap (``"sandbox": "bwrap"``) and/or as another account (``"user"``);
- runs it in the runner's workspace, or in the request's ``cwd`` resolved inside it (symlinks
  included: a ``cwd`` that resolves outside the workspace is refused);
- turns each stdout line into events by the preset's ``format`` (:mod:`delegation.runner.
  formats`): ``lines`` (a JSON object with a string ``kind`` is a structured event, any other
  line a ``text`` event), or a real agent's own records (``claude-stream-json``,
  ``codex-json``, ``gemini-stream-json``); each stderr line is an ``error`` event, except
  the lines a format knows to be informational (stored as ``log``);
- writes each steer to the process's stdin as one line;
- on a cancel sends SIGTERM to the process group, then SIGKILL after the preset's grace period;
- turns the exit status into the run's result (0) or error (anything else).

Placeholders in the command line (``{message}``, ``{systemPrompt}``, ``{runId}``,
``{conversationId}``, ``{profile}``, ``{depth}``, ``{cwd}``, ``{workspace}``) are replaced
per argument in one pass, never through a shell; a message starting with ``-`` is still one
argument, so put ``--`` before ``{message}`` where the program accepts it, or the program reads
it as an option.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
import re
import shutil
import signal
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delegation.client import ClientError, RpcError, event
from delegation.runner import fork, kept_sessions
from delegation.runner import process as proc
from delegation.runner.fork import ForkRefused
from delegation.runner.formats import FORMATS, make_format, model_from_argv
from delegation.runner.host import Outcome, RunContext
from delegation.runner.mcpconfig import (
    CODEX_TOKEN_ENV,
    GEMINI_FILE,
    LIVE_TOKENS,
    SHAPES,
    McpConfigFile,
    as_token,
    redact,
    redact_outcome,
    run_token,
)
from delegation.runner.presets import AgentPreset, PresetEngine, check_fields, confine
from delegation.runner.sandbox import PrivateHome, account

log = logging.getLogger("canopy.runner.command")

PLACEHOLDERS = (
    "message",
    "systemPrompt",
    "runId",
    "conversationId",
    "profile",
    "depth",
    "cwd",
    "workspace",
    "mcpConfig",
    "usageFile",
)
_PLACEHOLDER = re.compile("\\{(" + "|".join(PLACEHOLDERS) + ")\\}")
MAX_LINE = 1024 * 1024
# Claude Code's ``--input-format stream-json``: the task is the first user record on stdin,
# each steer another; stdin closes (and the agent exits) once every turn asked has ended.
CONVERSATION = "claude-stream-json"
# "none": the agent reads no steers (a one-shot ``-p`` CLI): every steer is promptRequired.
STEER_FORMATS = ("text", "json", CONVERSATION, "none")


@dataclass
class CommandPreset(AgentPreset):
    # "text": the message on one line; "json": a JSON object line; "claude-stream-json": the
    # task and each steer are user records of a Claude Code conversation on stdin (below).
    steer_format: str = "text"
    format: str = "lines"  # how stdout is read: see delegation.runner.formats
    mcp_config_shape: str = "claude"  # how {mcpConfig} names the server: see mcpconfig.SHAPES

    @property
    def uses_mcp_config(self) -> bool:
        # Codex finds its configuration through CODEX_HOME, not through a placeholder.
        return self._uses("{mcpConfig}") or self.mcp_config_shape == "codex"

    @property
    def uses_usage_file(self) -> bool:
        return self._uses("{usageFile}")

    def _uses(self, placeholder: str) -> bool:
        return any(placeholder in a for a in (*self.command, *self.env.values()))

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> CommandPreset:
        fields = check_fields(
            raw, label="preset", extra=("steerFormat", "format", "mcpConfigShape")
        )
        label = f"preset {fields['name']!r}"
        steer_format = raw.get("steerFormat", "text")
        if steer_format not in STEER_FORMATS:
            raise ValueError(f"{label}: 'steerFormat' must be one of {', '.join(STEER_FORMATS)}")
        if steer_format == CONVERSATION and raw.get("format") != "claude-stream-json":
            raise ValueError(
                f"{label}: 'steerFormat' {CONVERSATION!r} needs "
                "'format' 'claude-stream-json' (its result records end the turns)"
            )
        output_format = raw.get("format", "lines")
        if output_format not in FORMATS:
            raise ValueError(f"{label}: 'format' must be one of {', '.join(FORMATS)}")
        shape = raw.get("mcpConfigShape", "claude")
        if shape not in SHAPES:
            raise ValueError(f"{label}: 'mcpConfigShape' must be one of {', '.join(SHAPES)}")
        return cls(
            **fields, steer_format=steer_format, format=output_format, mcp_config_shape=shape
        )


class CommandEngine(PresetEngine):
    name = "command"
    preset_class = CommandPreset
    missing = "has no command here"
    # SPEC §14: run.pause / run.resume stop and continue the agent's processes.
    pause = staticmethod(proc.pause_run)
    resume = staticmethod(proc.resume_run)
    # Where finished Claude Code runs' transcripts are kept for forks from here (None: default).
    session_store: str | None = None

    def can_fork(self, preset: CommandPreset) -> bool:
        return fork.can_fork(preset)

    def __init__(self, presets: list[CommandPreset], workspace: str, *, mcp=None):
        super().__init__(presets, workspace, mcp=mcp or run_token)
        # The host tears an execution down only after the longest SIGTERM grace has passed.
        self.cancel_grace = max(p.cancel_grace for p in presets) + 2.0

    # -- one child -----------------------------------------------------------------------

    def environment(
        self, ctx: RunContext, preset: CommandPreset, cwd: str, mcp_config: str = ""
    ) -> dict[str, str]:
        # Placeholders in env values too: Gemini CLI finds its settings file through one.
        values = self.placeholders(ctx, preset, cwd, mcp_config)
        env = {k: _PLACEHOLDER.sub(lambda m: values[m.group(1)], v) for k, v in preset.env.items()}
        identity = {
            "CANOPY_RUN_ID": ctx.run_id,
            "CANOPY_CONVERSATION_ID": ctx.conversation_id,
            "CANOPY_PARENT_RUN_ID": getattr(ctx.identity, "parent_run_id", "") or "",
            "CANOPY_PROFILE": preset.name,
            "CANOPY_MESSAGE": ctx.message,
            "CANOPY_SYSTEM_PROMPT": values["systemPrompt"],
            "CANOPY_WORKSPACE": self.workspace,
            "CANOPY_CWD": cwd,
        }
        if "codex_home" in ctx.data:
            # Codex reads its MCP token from the variable its config.toml names (never argv).
            identity["CODEX_HOME"] = ctx.data["codex_home"]
            identity[CODEX_TOKEN_ENV] = ctx.data["run_token"]
        return proc.environment(preset, env, identity, ctx.depth)

    def placeholders(
        self, ctx: RunContext, preset: CommandPreset, cwd: str, mcp_config: str = ""
    ) -> dict[str, str]:
        return {
            "message": ctx.message,
            "systemPrompt": (ctx.preset.system_prompt if ctx.preset else "")
            or preset.system_prompt,
            "runId": ctx.run_id,
            "conversationId": ctx.conversation_id,
            "profile": preset.name,
            "depth": str(ctx.depth),
            "cwd": cwd,
            "workspace": self.workspace,
            "mcpConfig": mcp_config,
            "usageFile": ctx.data.get("usage_file_inside", ""),
        }

    def argv(
        self, ctx: RunContext, preset: CommandPreset, cwd: str, mcp_config: str = ""
    ) -> list[str]:
        values = self.placeholders(ctx, preset, cwd, mcp_config)
        # One pass: a value is never scanned again, so "{cwd}" inside a message stays text.
        return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], arg) for arg in preset.command]

    async def run(self, ctx: RunContext) -> Outcome:
        preset = self.preset_of(ctx)
        cwd = confine(self.workspace, ctx.cwd or preset.cwd)
        config = found = None
        if preset.uses_mcp_config:
            try:
                found = await self.mcp(ctx)
            except (RpcError, ClientError) as exc:
                return Outcome(error=f"{{mcpConfig}}: no run token from the server: {exc}")
            if not found:
                return Outcome(error="{mcpConfig}: no run token from the server")
            token = as_token(found)
        home = PrivateHome(preset) if preset.sandboxed else None
        if found:
            codex_home = None
            own_dir = {"codex": ".codex", "gemini": ".gemini"}.get(preset.mcp_config_shape)
            if own_dir and home is not None:
                # Codex's CODEX_HOME must be writable (it keeps its sessions there), Gemini
                # CLI skips settings under a world-writable /tmp: both go in a directory of
                # the child's private HOME, removed with it.
                codex_home = os.path.join(home.path, own_dir)
                os.makedirs(codex_home, mode=0o700, exist_ok=True)
                inside = os.path.join(_home_inside(preset), own_dir)
            try:
                config = McpConfigFile(
                    token,
                    ctx.depth,
                    user=preset.user,
                    shape=preset.mcp_config_shape,
                    directory=codex_home,
                )
            except BaseException:
                if home is not None:
                    home.remove()
                raise
            if preset.mcp_config_shape == "codex":
                ctx.data["codex_home"] = inside if codex_home else config.directory
            if codex_home and preset.mcp_config_shape == "gemini":
                ctx.data["mcp_config_inside"] = os.path.join(inside, GEMINI_FILE)
            ctx.data["mcp_config"] = config.path
            ctx.data["mcp_url"] = token.url
            ctx.data["run_token"] = token.token
            LIVE_TOKENS.add(token.token)
        usage = UsageFile(preset, home) if preset.uses_usage_file else None
        if usage is not None:
            ctx.data["usage_file_inside"] = usage.inside
        try:
            return redact_outcome(await self._run(ctx, preset, cwd, config, home, usage))
        finally:
            if config is not None:
                LIVE_TOKENS.discard(ctx.data["run_token"])
                config.remove()
            if usage is not None:
                usage.remove()
            self._keep_session(ctx, preset, home)
            if home is not None:
                home.remove()

    async def _run(
        self,
        ctx: RunContext,
        preset: CommandPreset,
        cwd: str,
        config: McpConfigFile | None,
        home: PrivateHome | None,
        usage: UsageFile | None = None,
    ) -> Outcome:
        # One agent process from spawn to outcome: output, steering and cancellation share
        # the process and its reader, so they are driven here together.
        mcp_path = ctx.data.get("mcp_config_inside") or (config.path if config else "")
        argv = self.argv(ctx, preset, cwd, mcp_path)
        ctx.data["private_home"], ctx.data["cwd"] = home, cwd
        if fork.wants_fork(ctx) or ctx.fork_from:
            try:
                argv = await self._prepare_fork(ctx, preset, cwd, home, argv)
            except (ForkRefused, OSError, ValueError) as exc:
                return Outcome(error=str(exc))
        # One queue keeps stdout and stderr events (and the egress proxy's refusals) in
        # arrival order, and one sender batches them: a chatty agent does not cost one round
        # trip per line.
        queue: asyncio.Queue = asyncio.Queue()
        process = await proc.spawn(
            preset,
            argv,
            workspace=self.workspace,
            cwd=cwd,
            env=self.environment(ctx, preset, cwd, mcp_path),
            limit=MAX_LINE,
            home=home,
            private=config.directory if config else None,
            mcp_url=ctx.data.get("mcp_url"),
            on_refusal=lambda text: queue.put_nowait(proc.refusal_event(text)),
        )
        ctx.data["process"] = process
        ctx.data["pid"] = process.pid
        if ctx.paused:
            proc.pause(process)
        state = {
            "last_stderr": None,
            "format": make_format(preset.format),
            "secret": ctx.data.get("run_token"),
        }
        # The format keeps the agent's session id (its init record): what a fork resumes.
        ctx.data["format"] = state["format"]
        ctx.data["anchors"] = []
        state["format"].model = model_from_argv(argv)
        if preset.steer_format == "none":
            # It reads no steers; an open stdin would make some CLIs (codex exec) wait on it.
            process.stdin.close()
        if preset.steer_format == CONVERSATION:
            state.update(stdin=process.stdin, prompts=1, closed=False, turns=0)
            ctx.data["conversation"] = state
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, RuntimeError):
                process.stdin.write(_user_record(ctx.message))
                await process.stdin.drain()
        readers = [
            asyncio.create_task(self._pump(process.stdout, queue, "stdout", state)),
            asyncio.create_task(self._pump(process.stderr, queue, "stderr", state)),
        ]
        sender = asyncio.create_task(proc.send_batches(ctx, queue))
        waiter = asyncio.create_task(process.wait())
        cancel = asyncio.create_task(ctx.cancel_event.wait())
        stopped_by_cancel = False
        try:
            await asyncio.wait([waiter, cancel], return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                stopped_by_cancel = True
                await proc.terminate(process, preset.cancel_grace)
            await waiter
            # A grandchild that inherited the pipes could keep them open forever: give the
            # readers a moment to drain, then take the whole process group down.
            _, pending = await asyncio.wait(readers, timeout=2.0)
            if pending:
                proc.kill_group(process.pid, signal.SIGKILL)
                await asyncio.wait(pending, timeout=1.0)
            if process.sandboxed:
                # bwrap exits with its agent's status while its own init may still be taking
                # the sandbox down: nothing of the sandbox outlives the run.
                proc.kill_group(process.pid, signal.SIGKILL)
            if usage is not None:
                for ev in state["format"].usage_file(usage.read()):
                    queue.put_nowait(ev)
            queue.put_nowait(None)
            await sender
        finally:
            cancel.cancel()
            for task in (*readers, sender, waiter):
                task.cancel()
            if process.returncode is None:
                proc.kill_group(process.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    await process.wait()
        if stopped_by_cancel or ctx.cancelled:
            return Outcome(cancelled=True)
        # The agent's own result record (or, for plain lines, its last text) and the exit
        # status make the outcome; see delegation.runner.formats.
        return state["format"].outcome(process.returncode, state["last_stderr"])

    async def _prepare_fork(
        self, ctx: RunContext, preset: CommandPreset, cwd: str, home, argv: list[str]
    ) -> list[str]:
        """The command line resuming the conversation forked: the live parent's, its
        transcript copied into this child's private HOME, or (fork from here) a finished
        run's kept one at a step (SPEC §14); ForkRefused when there is nothing to fork."""
        if not fork.can_fork(preset):
            raise ForkRefused(f"preset {preset.name} cannot fork")
        if ctx.fork_from:
            if preset.format != fork.CLAUDE:
                # Kept transcripts and resuming at a step are Claude Code's (see kept_sessions).
                raise ForkRefused(f"fork from here: preset {preset.name} is not Claude Code")
            store = self.session_store or kept_sessions.default_store()
            session, data, at = kept_sessions.resolve(store, ctx.fork_from)
            agent_home = home.path if home is not None else _agent_home(preset)
            kept_sessions.place(data, session, agent_home, cwd, account(preset))
            return kept_sessions.argv(argv, session, at)
        session, parent_home, _parent_cwd = fork.parent_session(ctx)
        if preset.format == fork.GEMINI and (home is None or parent_home is None):
            # Its fork is a copy in the child's own HOME: only a sandboxed child has one.
            raise ForkRefused(f"contextMode fork: preset {preset.name} forks only sandboxed")
        if home is not None and parent_home is not None:
            # Claude Code reports its session id (init) before its transcript is on disk: a
            # parent that delegates in its first turn may not have written it yet.
            deadline = asyncio.get_running_loop().time() + fork.TRANSCRIPT_WAIT
            owner = account(preset)
            while not fork.copy_transcript(
                session, parent_home, home.path, cwd, owner, fmt=preset.format
            ):
                if asyncio.get_running_loop().time() >= deadline:
                    raise ForkRefused(f"contextMode fork: no transcript of session {session}")
                await asyncio.sleep(0.1)
        return fork.fork_argv(argv, session, preset.format, _home_inside(preset))

    def _keep_session(self, ctx: RunContext, preset: CommandPreset, home) -> None:
        """A finished Claude Code run's transcript, kept for a fork from here."""
        session = getattr(ctx.data.get("format"), "session_id", "")
        if not session or preset.format != fork.CLAUDE:
            return
        agent_home = home.path if home is not None else _agent_home(preset)
        store = self.session_store or kept_sessions.default_store()
        try:
            kept_sessions.keep(store, session, agent_home, ctx.data.get("anchors") or [])
        except OSError as exc:
            log.warning("run %s: could not keep its transcript: %s", ctx.run_id, exc)

    async def _pump(self, reader, queue: asyncio.Queue, which: str, state: dict) -> None:
        while True:
            try:
                raw = await reader.readline()
            except ValueError:  # a line over MAX_LINE: asyncio has already dropped it
                queue.put_nowait(
                    event("error", error=f"{which} line over {MAX_LINE} bytes dropped")
                )
                continue
            if not raw:
                if which == "stdout":
                    for ev in state["format"].flush():
                        queue.put_nowait(ev)
                return
            line = redact(raw.decode("utf-8", errors="replace").rstrip("\r\n"), state["secret"])
            if which == "stderr":
                if line.strip():
                    stderr_ev = state["format"].stderr_event(line)
                    if stderr_ev is None:
                        queue.put_nowait(event("log", line))
                    else:
                        state["last_stderr"] = line
                        queue.put_nowait(stderr_ev)
                continue
            events = state["format"].feed(line)
            anchor = getattr(state["format"], "anchor", "")  # kept_sessions: where it came from
            for ev in events:
                queue.put_nowait({**ev, kept_sessions.ANCHOR: anchor} if anchor else ev)
            if "prompts" in state and not state["closed"]:
                self._maybe_end_conversation(state)

    @staticmethod
    def _maybe_end_conversation(state: dict) -> None:
        """After a turn's result, close stdin (so Claude Code exits) unless a prompt it has not
        taken yet is waiting: that one starts another turn.

        Claude Code folds a message that arrives during a tool call into the running turn and
        turns one that arrives between model calls into a turn of its own; with
        ``--replay-user-messages`` it echoes each message as it takes it, which tells the two
        apart. Without the echo, one turn per prompt is assumed.
        """
        fmt = state["format"]
        if fmt.turns_ended == state["turns"]:
            return
        state["turns"] = fmt.turns_ended
        taken = fmt.prompts_seen if fmt.prompts_seen else fmt.turns_ended
        if taken >= state["prompts"]:
            state["closed"] = True
            state["stdin"].close()

    async def steer(self, ctx: RunContext, message: str) -> str:
        """Write the steer to the agent's stdin; ``promptRequired`` if it cannot take it."""
        process = ctx.data.get("process")
        if process is None or process.returncode is not None or process.stdin is None:
            return "promptRequired"
        preset = self.presets_by_name.get(ctx.preset.name if ctx.preset else ctx.profile)
        if preset is not None and preset.steer_format == "none":
            return "promptRequired"
        conversation = ctx.data.get("conversation")
        if conversation is not None:
            if conversation["closed"]:
                return "promptRequired"
            # Counted before the write: the turn it asks for must keep stdin open.
            conversation["prompts"] += 1
            try:
                process.stdin.write(_user_record(message))
                await process.stdin.drain()
            except (BrokenPipeError, ConnectionResetError, RuntimeError):
                return "promptRequired"
            return "injected"
        if preset is not None and preset.steer_format == "json":
            line = json.dumps({"type": "steer", "message": message}, ensure_ascii=False)
        else:
            line = " ".join(message.splitlines())
        try:
            process.stdin.write(line.encode("utf-8") + b"\n")
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            return "promptRequired"
        return "injected"


class UsageFile:
    """Where an agent writes its usage figures when it prints none (``{usageFile}``): a file
    in its private HOME (the sandbox's only writable place besides the workspace), or in a
    private directory of its own when unsandboxed; read once the agent exited."""

    NAME = ".canopy-usage.json"
    LIMIT = 1024 * 1024

    def __init__(self, preset: CommandPreset, home: PrivateHome | None):
        self.directory = None
        if home is not None:
            self.inside = os.path.join(_home_inside(preset), self.NAME)
            self.host = os.path.join(home.path, self.NAME)
        else:
            self.directory = tempfile.mkdtemp(prefix="canopy-usage-")
            if preset.user:
                account = pwd.getpwnam(preset.user)
                os.chown(self.directory, account.pw_uid, account.pw_gid)
            self.inside = self.host = os.path.join(self.directory, self.NAME)

    def read(self) -> str:
        # The agent wrote it: bounded, and never followed through a link it planted.
        try:
            fd = os.open(self.host, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as fh:
            return fh.read(self.LIMIT).decode("utf-8", errors="replace")

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.host)
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def _agent_home(preset: CommandPreset) -> str:
    """An unsandboxed agent's HOME on this machine."""
    return preset.env.get("HOME") or proc.home_of(preset) or os.path.expanduser("~")


def _home_inside(preset: CommandPreset) -> str:
    """The HOME a sandboxed agent sees (its private HOME is mounted there)."""
    return preset.env.get("HOME") or proc.home_of(preset) or "/home/agent"


def _user_record(text: str) -> bytes:
    """One user turn of Claude Code's ``--input-format stream-json``."""
    record = {
        "type": "user",
        "message": {"role": "user", "content": [{"type": "text", "text": text}]},
    }
    return json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n"

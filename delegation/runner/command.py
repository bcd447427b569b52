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
  ``codex-json``, ``gemini-stream-json``); each stderr line is an ``error`` event;
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
import shlex
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delegation import depth as depthlib
from delegation import errors as codes
from delegation.client import ClientError, Preset, RpcError, event
from delegation.protocol import SERVER_EVENT_KINDS
from delegation.runner.formats import FORMATS, make_format
from delegation.runner.host import Outcome, RunContext
from delegation.runner.mcpconfig import (
    SHAPES,
    McpConfigFile,
    McpProvider,
    as_token,
    redact,
    run_token,
)

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
)
_PLACEHOLDER = re.compile("\\{(" + "|".join(PLACEHOLDERS) + ")\\}")
# All an agent gets of the runner's environment: anything else (the runner's token,
# SECRET_KEY, DATABASE_URL, cloud credentials) stays with the runner.
PASSED_ENV = ("PATH", "HOME", "LANG", "TERM")
SANDBOXES = ("bwrap",)
# What a bwrap sandbox sees of the machine, read-only: the system, not the runner's files.
SANDBOX_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
MAX_LINE = 1024 * 1024
# Claude Code's ``--input-format stream-json``: the task is the first user record on stdin,
# each steer another; stdin closes (and the agent exits) once every turn asked has ended.
CONVERSATION = "claude-stream-json"
STEER_FORMATS = ("text", "json", CONVERSATION)
FIT_BYTES = 256 * 1024
FIELD_BYTES = 32 * 1024
STRING_FIELDS = ("text", "toolName", "toolCallId", "error")


@dataclass
class CommandPreset:
    name: str
    command: list[str]
    system_prompt: str = ""
    options: Mapping[str, Any] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None  # default working directory, relative to the workspace
    cancel_grace: float = 5.0  # seconds between SIGTERM and SIGKILL
    # "text": the message on one line; "json": a JSON object line; "claude-stream-json": the
    # task and each steer are user records of a Claude Code conversation on stdin (below).
    steer_format: str = "text"
    format: str = "lines"  # how stdout is read: see delegation.runner.formats
    sandbox: str | None = None  # "bwrap": private /proc, the workspace the only writable path
    read_only: tuple[str, ...] = ()  # more paths a sandboxed agent may read (an interpreter)
    user: str | None = None  # run the agent as this account (the runner must be root)
    mcp_config_shape: str = "claude"  # how {mcpConfig} names the server: see mcpconfig.SHAPES

    @property
    def uses_mcp_config(self) -> bool:
        return any("{mcpConfig}" in a for a in (*self.command, *self.env.values()))

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> CommandPreset:
        known = {
            "name",
            "command",
            "systemPrompt",
            "options",
            "env",
            "cwd",
            "cancelGraceSeconds",
            "steerFormat",
            "format",
            "sandbox",
            "readOnly",
            "user",
            "mcpConfigShape",
        }
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"preset: unknown field(s) {', '.join(sorted(unknown))}")
        name = raw.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ValueError("preset: 'name' must be a non-blank string")
        command = raw.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(a, str) for a in command)
        ):
            raise ValueError(f"preset {name!r}: 'command' must be a non-empty list of strings")
        env = raw.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError(f"preset {name!r}: 'env' must map names to strings")
        steer_format = raw.get("steerFormat", "text")
        if steer_format not in STEER_FORMATS:
            raise ValueError(
                f"preset {name!r}: 'steerFormat' must be one of {', '.join(STEER_FORMATS)}"
            )
        if steer_format == CONVERSATION and raw.get("format") != "claude-stream-json":
            raise ValueError(
                f"preset {name!r}: 'steerFormat' {CONVERSATION!r} needs "
                "'format' 'claude-stream-json' (its result records end the turns)"
            )
        output_format = raw.get("format", "lines")
        if output_format not in FORMATS:
            raise ValueError(f"preset {name!r}: 'format' must be one of {', '.join(FORMATS)}")
        grace = raw.get("cancelGraceSeconds", 5.0)
        if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
            raise ValueError(f"preset {name!r}: 'cancelGraceSeconds' must be a number >= 0")
        shape = raw.get("mcpConfigShape", "claude")
        if shape not in SHAPES:
            raise ValueError(
                f"preset {name!r}: 'mcpConfigShape' must be one of {', '.join(SHAPES)}"
            )
        sandbox = raw.get("sandbox")
        if sandbox is not None and sandbox not in SANDBOXES:
            raise ValueError(f"preset {name!r}: 'sandbox' must be one of {', '.join(SANDBOXES)}")
        read_only = raw.get("readOnly", [])
        if not isinstance(read_only, list) or not all(
            isinstance(p, str) and os.path.isabs(p) for p in read_only
        ):
            raise ValueError(f"preset {name!r}: 'readOnly' must be a list of absolute paths")
        user = raw.get("user")
        if user is not None:
            if not isinstance(user, str) or not user:
                raise ValueError(f"preset {name!r}: 'user' must be an account name")
            try:
                pwd.getpwnam(user)
            except KeyError:
                raise ValueError(f"preset {name!r}: 'user' {user!r} is no account here") from None
        return cls(
            name=name,
            command=command,
            sandbox=sandbox,
            read_only=tuple(read_only),
            user=user,
            system_prompt=raw.get("systemPrompt", "") or "",
            options=raw.get("options"),
            env=env,
            cwd=raw.get("cwd"),
            cancel_grace=float(grace),
            steer_format=steer_format,
            format=output_format,
            mcp_config_shape=shape,
        )


def load_config(path: str | os.PathLike) -> dict:
    """Read a presets file: ``{"presets": [...], "workspace"?: ..., "extensionId"?: ...}``."""
    with open(path, encoding="utf-8") as fh:
        raw = json.load(fh)
    if isinstance(raw, list):
        raw = {"presets": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("presets"), list):
        raise ValueError(f"{path}: expected an object with a 'presets' list")
    unknown = set(raw) - {"presets", "workspace", "extensionId"}
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")
    # Relative program paths ("./agents/review.sh") and a relative workspace are relative to
    # the file, not to wherever the runner happens to be started.
    base = Path(path).resolve().parent
    for preset in raw["presets"]:
        command = preset.get("command") if isinstance(preset, dict) else None
        if isinstance(command, str):
            command = preset["command"] = shlex.split(command)
        if isinstance(command, list) and command and isinstance(command[0], str):
            program = command[0]
            if "/" in program and not os.path.isabs(program):
                command[0] = str(base / program)
    if isinstance(raw.get("workspace"), str) and not os.path.isabs(raw["workspace"]):
        raw["workspace"] = str(base / raw["workspace"])
    return raw


def confine(workspace: str, cwd: str | None) -> str:
    """``cwd`` resolved inside ``workspace`` (after symlinks); ValueError if it escapes."""
    base = Path(workspace).resolve()
    target = (base / cwd).resolve() if cwd else base
    if target != base and base not in target.parents:
        raise ValueError(f"cwd {cwd!r} resolves outside the workspace {str(base)!r}")
    if not target.is_dir():
        raise ValueError(f"cwd {cwd!r} is not a directory inside the workspace")
    return str(target)


def line_event(line: str) -> dict:
    """One stdout line as an event: a JSON object with a string ``kind``, else ``text``."""
    stripped = line.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("kind"), str):
            built = _structured(data)
            if built is not None:
                return built
    return event("text", line)


def _structured(data: dict) -> dict | None:
    kind = data["kind"].strip()
    if not kind or kind in SERVER_EVENT_KINDS or len(kind.encode()) > 64:
        return None  # the server's own kinds cannot be forged from an agent's stdout
    out: dict[str, Any] = {"kind": kind}
    for name in STRING_FIELDS:
        value = data.get(name)
        if value is not None:
            if not isinstance(value, str):
                return None
            out[name] = value
    if "success" in data and data["success"] is not None:
        if not isinstance(data["success"], bool):
            return None
        out["success"] = data["success"]
    for name in ("input", "toolOutput"):
        if data.get(name) is not None:
            out[name] = data[name]
    return out


def fit(ev: dict) -> dict:
    """Cut an oversized event to what the server keeps anyway (32 KiB per field)."""
    if len(json.dumps(ev, ensure_ascii=False).encode("utf-8")) <= FIT_BYTES:
        return ev
    out = dict(ev)
    for name, value in ev.items():
        if name == "kind":
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if len(text.encode("utf-8")) > FIELD_BYTES:
            cut = text.encode("utf-8")[:FIELD_BYTES].decode("utf-8", errors="ignore")
            out[name] = cut + " [truncated by the runner]"
    return out


class CommandEngine:
    name = "command"

    def __init__(
        self,
        presets: list[CommandPreset],
        workspace: str,
        *,
        mcp: McpProvider | None = None,
    ):
        if not presets:
            raise ValueError("the command engine needs at least one preset")
        names = [p.name for p in presets]
        if len(set(names)) != len(names):
            raise ValueError("duplicate preset names")
        self.presets_by_name = {p.name: p for p in presets}
        self.workspace = str(Path(workspace).resolve())
        self.mcp = mcp or run_token
        # The host tears an execution down only after the longest SIGTERM grace has passed.
        self.cancel_grace = max(p.cancel_grace for p in presets) + 2.0

    @classmethod
    def from_config(cls, config: Mapping[str, Any], workspace: str | None = None, **kwargs):
        presets = [CommandPreset.from_config(p) for p in config["presets"]]
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
                codes.INVALID_PARAMS, f"preset {command.preset.name!r} has no command here"
            )
        try:
            confine(self.workspace, command.request.get("cwd") or preset.cwd)
        except ValueError as exc:
            raise RpcError(codes.INVALID_PARAMS, f"request.cwd: {exc}") from None

    # -- one child -----------------------------------------------------------------------

    def environment(
        self, ctx: RunContext, preset: CommandPreset, cwd: str, mcp_config: str = ""
    ) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        if preset.user:
            env["HOME"] = pwd.getpwnam(preset.user).pw_dir
        # Placeholders in env values too: Gemini CLI finds its settings file through one.
        values = self.placeholders(ctx, preset, cwd, mcp_config)
        env.update(
            {k: _PLACEHOLDER.sub(lambda m: values[m.group(1)], v) for k, v in preset.env.items()}
        )
        env.update(
            {
                "CANOPY_RUN_ID": ctx.run_id,
                "CANOPY_CONVERSATION_ID": ctx.conversation_id,
                "CANOPY_PARENT_RUN_ID": getattr(ctx.identity, "parent_run_id", "") or "",
                "CANOPY_PROFILE": preset.name,
                "CANOPY_MESSAGE": ctx.message,
                "CANOPY_SYSTEM_PROMPT": (ctx.preset.system_prompt if ctx.preset else "")
                or preset.system_prompt,
                "CANOPY_WORKSPACE": self.workspace,
                "CANOPY_CWD": cwd,
            }
        )
        # Set last and explicitly: an inherited value would be the runner's level.
        return depthlib.child_env(ctx.depth, env)

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
        }

    def argv(
        self, ctx: RunContext, preset: CommandPreset, cwd: str, mcp_config: str = ""
    ) -> list[str]:
        values = self.placeholders(ctx, preset, cwd, mcp_config)
        # One pass: a value is never scanned again, so "{cwd}" inside a message stays text.
        return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], arg) for arg in preset.command]

    def bwrap(self, preset: CommandPreset, cwd: str, private: str | None = None) -> list[str]:
        """The bubblewrap prefix: the system read-only, the workspace the one writable path,
        a private /proc (no other process, the runner included, is visible), a fresh /tmp
        (with the child's own MCP configuration directory, ``private``, read-only in it)."""
        out = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--new-session"]
        for path in SANDBOX_SYSTEM + preset.read_only:
            out += ["--ro-bind-try", path, path]
        out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        if private:
            out += ["--ro-bind", private, private]
        out += ["--bind", self.workspace, self.workspace, "--chdir", cwd, "--"]
        return out

    async def run(self, ctx: RunContext) -> Outcome:
        preset = self.presets_by_name[ctx.preset.name if ctx.preset else ctx.profile]
        cwd = confine(self.workspace, ctx.cwd or preset.cwd)
        config = None
        if preset.uses_mcp_config:
            try:
                found = await self.mcp(ctx)
            except (RpcError, ClientError) as exc:
                return Outcome(error=f"{{mcpConfig}}: no run token from the server: {exc}")
            if not found:
                return Outcome(error="{mcpConfig}: no run token from the server")
            token = as_token(found)
            config = McpConfigFile(
                token, ctx.depth, user=preset.user, shape=preset.mcp_config_shape
            )
            ctx.data["mcp_config"] = config.path
            ctx.data["run_token"] = token.token
        try:
            return await self._run(ctx, preset, cwd, config)
        finally:
            if config is not None:
                config.remove()

    async def _run(
        self, ctx: RunContext, preset: CommandPreset, cwd: str, config: McpConfigFile | None
    ) -> Outcome:
        mcp_path = config.path if config else ""
        argv = self.argv(ctx, preset, cwd, mcp_path)
        if preset.sandbox == "bwrap":
            argv = self.bwrap(preset, cwd, config.directory if config else None) + argv
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=self.environment(ctx, preset, cwd, mcp_path),
            user=preset.user,
            # A user switch must not keep root's supplementary groups.
            extra_groups=[] if preset.user else None,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: a cancel reaches its children
            limit=MAX_LINE,
        )
        ctx.data["process"] = process
        ctx.data["pid"] = process.pid
        state = {
            "last_stderr": None,
            "format": make_format(preset.format),
            "secret": ctx.data.get("run_token"),
        }
        if preset.steer_format == CONVERSATION:
            state.update(stdin=process.stdin, prompts=1, closed=False, turns=0)
            ctx.data["conversation"] = state
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, RuntimeError):
                process.stdin.write(_user_record(ctx.message))
                await process.stdin.drain()
        # One queue keeps stdout and stderr events in arrival order, and one sender batches
        # them: a chatty agent does not cost one round trip per line.
        queue: asyncio.Queue = asyncio.Queue()
        readers = [
            asyncio.create_task(self._pump(process.stdout, queue, "stdout", state)),
            asyncio.create_task(self._pump(process.stderr, queue, "stderr", state)),
        ]
        sender = asyncio.create_task(self._send(ctx, queue))
        waiter = asyncio.create_task(process.wait())
        cancel = asyncio.create_task(ctx.cancel_event.wait())
        stopped_by_cancel = False
        try:
            await asyncio.wait([waiter, cancel], return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                stopped_by_cancel = True
                await self._terminate(process, preset.cancel_grace)
            await waiter
            # A grandchild that inherited the pipes could keep them open forever: give the
            # readers a moment to drain, then take the whole process group down.
            _, pending = await asyncio.wait(readers, timeout=2.0)
            if pending:
                _kill_group(process.pid, signal.SIGKILL)
                await asyncio.wait(pending, timeout=1.0)
            queue.put_nowait(None)
            await sender
        finally:
            cancel.cancel()
            for task in (*readers, sender, waiter):
                task.cancel()
            if process.returncode is None:
                _kill_group(process.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    await process.wait()
        if stopped_by_cancel or ctx.cancelled:
            return Outcome(cancelled=True)
        # The agent's own result record (or, for plain lines, its last text) and the exit
        # status make the outcome; see delegation.runner.formats.
        return state["format"].outcome(process.returncode, state["last_stderr"])

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
                    state["last_stderr"] = line
                    queue.put_nowait(event("error", error=line))
                continue
            for ev in state["format"].feed(line):
                queue.put_nowait(ev)
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

    async def _send(self, ctx: RunContext, queue: asyncio.Queue) -> None:
        done = False
        while not done:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            if batch[-1] is None:
                batch.pop()
                done = True
            if batch:
                await ctx.emit(*batch)

    async def _terminate(self, process, grace: float) -> None:
        _kill_group(process.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(grace):
                await process.wait()
        except TimeoutError:
            log.info("pid %s ignored SIGTERM for %.1fs; sending SIGKILL", process.pid, grace)
            _kill_group(process.pid, signal.SIGKILL)

    async def steer(self, ctx: RunContext, message: str) -> str:
        """Write the steer to the agent's stdin; ``promptRequired`` if it cannot take it."""
        process = ctx.data.get("process")
        if process is None or process.returncode is not None or process.stdin is None:
            return "promptRequired"
        preset = self.presets_by_name.get(ctx.preset.name if ctx.preset else ctx.profile)
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


def _user_record(text: str) -> bytes:
    """One user turn of Claude Code's ``--input-format stream-json``."""
    record = {
        "type": "user",
        "message": {"role": "user", "content": [{"type": "text", "text": text}]},
    }
    return json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n"


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)

"""One kodelet extension process hosted for one run, its host methods mapped onto Canopy.

| extension → host | Canopy |
|---|---|
| ``kodelet.runtime.background.acquire`` / ``.release`` | a lease of the run (§6) |
| ``kodelet.tool.update`` | a ``tool-update`` event of the run |
| ``kodelet.ui.notify`` | a ``notify`` event of the run |
| ``kodelet.ui.confirm`` / ``select`` / ``input`` | an approval of kind ``question`` (§11) |
| ``kodelet.conversation.fork`` | a session of Canopy's ``kodelet`` whose first turn is a child started with ``contextMode: "fork"`` (SPEC §14); ``FORK_UNAVAILABLE`` where the engine cannot fork |

The process gets Canopy's ``kodelet`` first on its ``PATH`` (:mod:`.acp`), and the path of
the :class:`~.bridge.Bridge` socket that ``kodelet`` asks for child runs. A process that dies
is started again (at most ``MAX_RESTARTS`` times); meanwhile its tools answer that it is
restarting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import delegation
from delegation.client import event
from delegation.runner.kodelet.bridge import Bridge
from delegation.runner.kodelet.framing import HostMethodError, Peer, PeerError
from delegation.runner.kodelet.leases import LeaseBook
from delegation.runner.kodelet.spec import ExtensionSpec

if TYPE_CHECKING:
    from delegation.runner.host import RunContext

log = logging.getLogger("canopy.runner.kodelet")

PROTOCOL_VERSION = "2026-05-30"
# The kodelet version this host answers as: the one kodelet-sdk 0.6 was released against.
KODELET_VERSION = "0.6.1"
# What kodelet's own host answers when a live fork is not possible; the SDK turns this code
# into ConversationForkUnavailableError, which kodelet-subagent reports by name.
FORK_UNAVAILABLE = -32004
MAX_RESTARTS = 3
SOCKET_ENV = "CANOPY_KODELET_SOCKET"
INIT_TIMEOUT = 30.0


def kodelet_wrapper(bin_dir: Path) -> Path:
    """``bin_dir/kodelet``: Canopy's ``kodelet`` on this runner's interpreter and this
    runner's own ``delegation`` package, wherever the extension runs it from, whether or
    not the project's console scripts are installed."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "kodelet"
    root = shlex.quote(str(Path(delegation.__file__).resolve().parent.parent))
    path.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}} exec {shlex.quote(sys.executable)} "
        '-m delegation.runner.kodelet.acp "$@"\n'
    )
    path.chmod(0o700)
    return path


class HostedExtension:
    def __init__(
        self,
        spec: ExtensionSpec,
        ctx: RunContext,
        workdir: Path,
        index: int = 0,
        cwd: str | None = None,
        forkable: frozenset[str] = frozenset(),
    ):
        self.spec = spec
        self.ctx = ctx
        self.workdir = workdir
        # The run's directory (else the engine's workspace): the extension's agents start
        # there, and a child's cwd must be inside the workspace.
        self.cwd = ctx.cwd or cwd or os.getcwd()
        self.extension_id = f"{spec.extension_id}-{index}" if index else spec.extension_id
        self.forkable = forkable  # the presets of this runner whose children can fork
        self.leases = LeaseBook(ctx)
        self.bridge = Bridge(
            ctx,
            self.leases,
            str(workdir / "kodelet.sock"),
            spec.child_profile or ctx.profile,
        )
        self.tools: list[dict] = []
        self.disabled: set[str] = set()
        self.peer: Peer | None = None
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.stopping = False
        self.ready = asyncio.Event()
        self.current_call: str | None = None
        self._watch: asyncio.Task | None = None
        self._stderr: asyncio.Task | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.workdir / "data").mkdir(exist_ok=True)
        kodelet_wrapper(self.workdir / "bin")
        await self.bridge.start()
        await self._spawn()
        self._watch = asyncio.create_task(self._keep_alive(), name=f"kodelet-{self.extension_id}")

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.workdir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env[SOCKET_ENV] = self.bridge.path
        return env

    async def _spawn(self) -> None:
        self.ready.clear()
        self.process = await asyncio.create_subprocess_exec(
            *self.spec.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self.cwd,
            env=self.env(),
            start_new_session=True,
        )
        self._stderr = asyncio.create_task(self._log_stderr(self.process))
        self.peer = Peer(
            self.process.stdout, self.process.stdin, self.handlers(), name=self.extension_id
        )
        self.peer.start()
        answer = await self.peer.request("extension.initialize", self.init_params(), INIT_TIMEOUT)
        self.tools = [t for t in (answer or {}).get("tools", []) if isinstance(t, dict)]
        init = await self.peer.request(
            "extension.event.handle",
            {
                "id": uuid.uuid4().hex,
                "event": "agent.init",
                "payload": {},
                "context": self.context(),
            },
            INIT_TIMEOUT,
        )
        tools_patch = (init or {}).get("tools") or {}
        self.disabled = set(tools_patch.get("disable") or ())
        self.ready.set()

    def init_params(self) -> dict:
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "kodelet": {"version": KODELET_VERSION},
            "extension": {
                "id": self.extension_id,
                "cwd": self.cwd,
                "dataDir": str(self.workdir / "data"),
                "runnerId": self.ctx.host.extension_id,
                "config": dict(self.spec.config),
            },
            "capabilities": {
                "runtime": {"backgroundTasks": True},
                "tools": {"updates": True},
                # Fork only where this run's agent can be forked (SPEC §14); elsewhere
                # kodelet's SDK refuses a fork itself, as ConversationForkUnavailableError.
                "conversations": {"fork": self.ctx.profile in self.forkable, "hierarchy": True},
                "ui": {"widgets": False, "surfaces": False, "transcript": False},
            },
        }

    def context(self) -> dict:
        return {
            "sessionId": self.ctx.run_id,
            "conversationId": self.ctx.conversation_id,
            "cwd": self.cwd,
            # kodelet-subagent starts its fresh agents on the caller's profile: the preset's
            # childProfile when it names one.
            "profile": self.spec.child_profile or self.ctx.profile,
            "invokedBy": "main",
        }

    async def _log_stderr(self, process: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(Exception):
            while line := await process.stderr.readline():
                log.info("%s: %s", self.extension_id, line.decode(errors="replace").rstrip())

    async def _keep_alive(self) -> None:
        """An extension that dies is started again; its tools say so meanwhile."""
        while not self.stopping:
            await self.process.wait()
            if self.stopping:
                return
            self.ready.clear()
            if self.restarts >= MAX_RESTARTS:
                await self._note(f"extension {self.extension_id} died {self.restarts + 1} times")
                return
            self.restarts += 1
            await self._note(f"extension {self.extension_id} exited; restarting")
            await asyncio.sleep(0.5)
            try:
                await self._spawn()
            except Exception as exc:
                log.warning("restarting %s failed: %s", self.extension_id, exc)

    async def stop(self) -> None:
        self.stopping = True
        if self.peer is not None and self.ready.is_set():
            # kodelet-subagent stops its agents on session.end (and closes their leases).
            with contextlib.suppress(Exception):
                await self.peer.request(
                    "extension.event.handle",
                    {
                        "id": uuid.uuid4().hex,
                        "event": "session.end",
                        "payload": {},
                        "context": self.context(),
                    },
                    15,
                )
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, 9)
                await self.process.wait()
        if self.peer is not None:
            await self.peer.close()
        for task in (self._watch, self._stderr):
            if task is not None:
                task.cancel()
        await self.leases.release_all()
        await self.bridge.close()

    # -- the run's agent calls a tool ---------------------------------------------------

    def tool_names(self) -> list[str]:
        return [t["name"] for t in self.tools if t.get("name") not in self.disabled]

    async def call_tool(self, name: str, input: Any, tool_call_id: str = "") -> dict:
        """``extension.tool.execute``: the extension's result (``content``, ``error``?,
        ``structuredContent``?), or an error result while the process is restarting."""
        if not self.ready.is_set():
            message = f"extension {self.extension_id} is restarting; try {name} again shortly"
            return {"content": message, "error": message}
        if name not in self.tool_names():
            message = f"extension {self.extension_id} has no tool {name!r}"
            return {"content": message, "error": message}
        self.current_call = tool_call_id or None
        try:
            return await self.peer.request(
                "extension.tool.execute",
                {
                    "name": name,
                    "input": input,
                    "context": {**self.context(), "toolCallId": tool_call_id},
                },
            )
        except PeerError as exc:
            if exc.code == 0:
                self.ready.clear()  # it died: calls say so until _keep_alive restarted it
            message = f"{name} failed: {exc.message}"
            return {"content": message, "error": message}

    # -- host methods -------------------------------------------------------------------

    def handlers(self) -> dict:
        return {
            "kodelet.runtime.background.acquire": self._acquire,
            "kodelet.runtime.background.release": self._release,
            "kodelet.tool.update": self._tool_update,
            "kodelet.ui.notify": self._notify,
            "kodelet.ui.confirm": self._confirm,
            "kodelet.ui.select": self._select,
            "kodelet.ui.input": self._input,
            "kodelet.conversation.fork": self._fork,
        }

    async def _acquire(self, params: Any) -> dict:
        description = str((params or {}).get("description") or "")
        return {"leaseId": self.leases.acquire(description)}

    async def _release(self, params: Any) -> dict:
        lease_id = str((params or {}).get("leaseId") or "")
        await self.leases.release(lease_id)
        return {}

    async def _note(self, text: str, kind: str = "notify", **more: Any) -> None:
        with contextlib.suppress(Exception):
            await self.ctx.emit(event(kind, text, **more))

    async def _tool_update(self, params: Any) -> dict:
        params = params or {}
        more = {"tool_call_id": self.current_call} if self.current_call else {}
        await self._note(str(params.get("content", "")), "tool-update", **more)
        return {}

    async def _notify(self, params: Any) -> dict:
        await self._note(str((params or {}).get("message", "")), "notify")
        return {}

    async def _question(self, method: str, params: Any) -> dict:
        """One approval of kind ``question`` with the extension's text; the operator's answer
        comes back as the decision (and, for select and input, its message)."""
        params = dict(params or {})
        title = str(params.get("title") or params.get("message") or method)
        return await self.ctx.ask_approval(
            f"{self.extension_id}-{uuid.uuid4().hex[:12]}",
            f"{self.extension_id}.{method}",
            params,
            kind="question",
            title=title,
            can_edit=False,
        )

    async def _confirm(self, params: Any) -> dict:
        answer = await self._question("confirm", params)
        if answer.get("decision") == "cancelled":
            return {"status": "cancelled"}
        return {"status": "submitted", "confirmed": answer.get("decision") == "allow"}

    async def _select(self, params: Any) -> dict:
        answer = await self._question("select", params)
        options = [
            o.get("value") if isinstance(o, dict) else o for o in (params or {}).get("options", [])
        ]
        value = (answer.get("message") or "").strip()
        if answer.get("decision") != "allow" or (options and value not in options):
            return {"status": "cancelled"}
        return {"status": "submitted", "value": value}

    async def _input(self, params: Any) -> dict:
        answer = await self._question("input", params)
        if answer.get("decision") != "allow":
            return {"status": "cancelled"}
        # The operator's text is the decision's message; allowed without one, the
        # extension's own default (else the empty string).
        default = str((params or {}).get("defaultValue") or "")
        return {"status": "submitted", "value": answer.get("message") or default}

    async def _fork(self, params: Any) -> dict:
        """``{conversationId}``: a session of Canopy's ``kodelet`` that, loaded and prompted,
        is a child of this run started as a fork of its agent's conversation (SPEC §14). It
        runs on the extension's ``childProfile`` when that preset can fork, else on the
        run's own preset. Refused by name (``FORK_UNAVAILABLE``, which kodelet-subagent
        reports) when this run's agent cannot be forked: never a silent fresh start."""
        if self.ctx.profile not in self.forkable:
            raise HostMethodError(
                FORK_UNAVAILABLE,
                f"conversation fork unavailable: preset {self.ctx.profile!r} cannot fork; "
                "use context_mode 'fresh'",
            )
        if not getattr(self.ctx.data.get("format"), "session_id", ""):
            raise HostMethodError(
                FORK_UNAVAILABLE,
                f"conversation fork unavailable: run {self.ctx.run_id} has no agent session "
                "to fork (yet)",
            )
        child = self.spec.child_profile
        profile = child if child in self.forkable else self.ctx.profile
        return {"conversationId": self.bridge.fork(profile, self.cwd)}

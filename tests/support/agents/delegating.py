"""What every real-agent delegation test shares, whatever the CLI and its model wire.

:class:`DelegateScript` is the one script all the scripted model endpoints run (Anthropic
Messages, OpenAI Responses, Gemini): "at level L call the delegate tool once with task L+1,
then answer quoting its result". It reads only what every stub's request offers:
``tool_names``, ``tool_uses``, ``tool_results``, ``tool_result_text`` and ``first_text``.

:class:`AgentTree` runs a :class:`CommandEngine` (or any engine) under a real
:class:`RunnerHost` on a daphne server, remembers each child's process group and samples every
process's argv while the tree runs, so a test can say no run token was on any command line.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from pathlib import Path

from asgiref.sync import sync_to_async

from delegation.models import Event, Run
from delegation.runner.host import RunnerHost
from delegation.runner.model_stub import Text, ToolCall
from delegation.services import tokens
from tests.support import runners

FAST = {**runners.FAST, "call_timeout": 60}
TOKEN = re.compile(rb"cn[rta]_[A-Za-z0-9_\-]{20,}")


class DelegateScript:
    """Each level's model: delegate ``task L<n+1>`` (to ``profile``) once, then answer.

    ``tools`` maps a tool name the agent offers to the profile its child runs (the first
    offered wins), so one script drives a mixed tree; ``hold`` keeps the first turn of that
    level waiting until ``released`` (for cancels)."""

    def __init__(self, tools: dict[str, str] | str, profile: str = "", hold: int | None = None):
        self.tools = tools if isinstance(tools, dict) else {tools: profile}
        self.hold = hold
        self.held = threading.Event()
        self.released = threading.Event()
        # Per level, which child profile to ask for (default: the tool's own profile).
        self.child_profiles: dict[int, str] = {}

    def __call__(self, request):
        tool = next((t for t in self.tools if t in request.tool_names), None)
        if tool is None:
            return Text("ok")  # a CLI's side request (titles, summaries, routing)
        found = re.search(r"task L(\d+)", request.first_text)
        level = int(found[1]) if found else 0
        if not any(u.get("name") == tool for u in request.tool_uses):
            if level == self.hold:
                self.held.set()
                self.released.wait(120)
            profile = self.child_profiles.get(level, self.tools[tool])
            args = {"profile": profile, "message": f"task L{level + 1}", "waitSeconds": 50}
            return ToolCall(tool, args, text=f"L{level} delegating.")
        result = request.tool_results[-1]
        said = request.tool_result_text(result)
        if result.get("is_error") or "-32010" in said or "refused" in said.lower():
            return Text(f"L{level} did it itself (refused: {said[:200]})")
        return Text(f"L{level} done; child said: {said[:100]}")


def live_processes() -> dict[int, tuple[int, int]]:
    """Every running (non-zombie) process of the machine: pid -> (parent pid, group)."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != b"Z":
                found[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return found


def group_alive(pgid: int) -> bool:
    """Whether a (non-zombie) process of group ``pgid`` still runs."""
    return any(group == pgid for _parent, group in live_processes().values())


def descendants(pid: int) -> set[int]:
    """Every running process below ``pid``, those in sessions of their own included."""
    parents = {p: parent for p, (parent, _group) in live_processes().items()}
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def tokens_on_argv() -> set[bytes]:
    """Every Canopy token on the command line of any process of this machine."""
    found: set[bytes] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                found |= set(TOKEN.findall(Path(f"/proc/{entry.name}/cmdline").read_bytes()))
            except OSError:
                continue
    return found


async def wait_for(check, timeout=90, what="condition"):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := await check()):
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return value


def runs_by_depth(root_id) -> dict[int, list[Run]]:
    root = Run.objects.get(run_id=root_id)
    out: dict[int, list[Run]] = {}
    for run in [root, *Run.objects.filter(root=root).order_by("pk")]:
        out.setdefault(run.depth, []).append(run)
    return out


def events_of(run) -> list[Event]:
    return list(Event.objects.filter(run=run).order_by("sequence"))


class AgentTree:
    """A runner host for ``engine`` on ``server``; records pids, tokens and argv samples."""

    def __init__(self, server, engine, name="agents"):
        self.server, self.engine, self.name = server, engine, name
        self.pids: dict[str, int] = {}
        self.tokens: set[str] = set()
        self.argv_tokens: set[bytes] = set()

    async def __aenter__(self):
        _runner, token = await sync_to_async(tokens.create_runner)(self.name)
        self.host = RunnerHost(
            self.server.ws_url, token, self.engine, extension_id=self.name, client_options=FAST
        )
        run = self.engine.run

        async def watched(ctx):
            task = asyncio.ensure_future(run(ctx))
            while "pid" not in ctx.data and not task.done():
                await asyncio.sleep(0.01)
            if "pid" in ctx.data:
                self.pids[ctx.run_id] = ctx.data["pid"]
            if ctx.data.get("run_token"):
                self.tokens.add(ctx.data["run_token"])
            while not task.done():  # argv of every process while this child runs
                if ctx.data.get("run_token"):  # an ACP child gets its own at session/new
                    self.tokens.add(ctx.data["run_token"])
                self.argv_tokens |= await asyncio.to_thread(tokens_on_argv)
                await asyncio.wait([task], timeout=0.3)
            return await task

        self.engine.run = watched
        await self.host.start()
        return self

    async def __aexit__(self, *exc):
        await self.host.stop()

    def leaked_on_argv(self) -> set[bytes]:
        return {t for t in self.argv_tokens if t.decode() in self.tokens}

    def leaked(self) -> list[str]:
        """Where a child's run token showed: any argv while it ran, the server's log, or any
        stored event (text, error, input, output, data) of any run."""
        found = [f"argv {t!r}" for t in self.leaked_on_argv()]
        log = self.server.log()
        found += [f"server log {t[:6]}" for t in self.tokens if t in log]
        for ev in Event.objects.all():
            stored = json.dumps([ev.text, ev.error, ev.input, ev.tool_output, ev.data], default=str)
            found += [f"event {ev.kind} {t[:6]}" for t in self.tokens if t in stored]
        return found


def check_capped_pair(root_id, delegate: str) -> dict[int, tuple[Run, list[Event], list]]:
    """A root that delegated once through ``delegate`` and a child refused at the cap
    (``DELEGATION_MAX_DEPTH=1``): both succeeded, each tool use paired with its result by the
    agent's own id, usage reported, the child ``via: mcp`` with its ``delegation-refused``.
    Returns ``{depth: (run, events, usage inputs)}`` for the agent's own checks."""
    by_depth = runs_by_depth(root_id)
    assert sorted(by_depth) == [0, 1]
    out = {}
    for depth, (run,) in by_depth.items():
        events = events_of(run)
        kinds = [e.kind for e in events]
        assert run.status == "succeeded", (depth, run.error, kinds)
        (use,) = [e for e in events if e.kind == "tool-use"]
        (result,) = [e for e in events if e.kind == "tool-result"]
        assert use.tool_name == delegate and result.tool_call_id == use.tool_call_id
        usage = [e.input for e in events if e.kind == "usage"]
        assert usage and usage[0]["inputTokens"] > 0, kinds
        assert run.output.startswith(f"L{depth}"), run.output
        out[depth] = (run, events, usage)
    child = by_depth[1][0]
    assert child.via == "mcp" and child.parent.run_id == root_id
    assert "delegation-refused" in [e.kind for e in out[1][1]]
    return out


async def check_cancel_leaves_no_process(
    tree: AgentTree, script: DelegateScript, profile: str, steer: str = "promptRequired"
):
    """Start one ``profile`` child whose model turn ``script`` holds (``hold=0``), cancel it:
    the child ends ``cancelled``, nothing of its process group is left and a steer after the
    cancel is refused (``promptRequired``); ``steer`` is the answer to one before it."""
    c, ext, gen = tree.host.client, tree.host.extension_id, tree.host.generation
    await c.open_run("conv", "parent")
    child = await c.child_start(
        "parent", ext, gen, {"requestId": "r1", "profile": profile, "message": "x"}
    )
    await wait_for(lambda: _now(script.held.is_set()), what=f"{profile}'s model turn")
    ctx = tree.host.runs[child.run_id]
    assert await tree.engine.steer(ctx, "more") == steer
    (pid,) = tree.pids.values()
    assert group_alive(pid)
    await c.child_cancel("parent", ext, gen, child.child_id)
    script.released.set()
    done = await wait_for(
        lambda: _done(c.child_read("parent", ext, gen, child.child_id)), what="cancel"
    )
    assert done.status == "cancelled"
    await wait_for(lambda: _now(not group_alive(pid)), what="the process group")
    assert await tree.engine.steer(ctx, "too late") == "promptRequired"
    await c.finish("parent", output="ok")


async def _now(value):
    return value


async def _done(result):
    result = await result
    return result if result.done else None

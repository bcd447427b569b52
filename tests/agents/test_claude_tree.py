"""A tree of real Claude Code processes (SPEC §9), offline: the reference runner's command
engine runs the README's ``claude`` preset (the pinned CLI from ``make agents``) for every run,
each process gets Canopy's ``/mcp`` through its ``{mcpConfig}``, and the scripted model at each
level calls ``mcp__canopy__delegate`` once, then answers. A real daphne server, real MCP
over HTTP, real processes; the only stand-in is the model endpoint."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import urllib.request

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Event, Run
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.model_stub import ModelStub, Text, ToolCall
from tests.support.agents.delegating import AgentTree
from tests.support.real_agents import offline_claude_preset

pytestmark = [
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]

DELEGATE = "mcp__canopy__delegate"
MAX_DEPTH = 2


class TreeScript:
    """Each level's model: delegate ``task L<n+1>`` once, then answer with what came back.

    The level is read from the conversation's first user message (``task L<n>``). ``hold``
    keeps the first turn of that level waiting until released (for steers and cancels); a
    user message with ``STEER:`` is answered as a steer.
    """

    def __init__(self, hold_level: int | None = None):
        self.hold_level = hold_level
        self.released = threading.Event()
        self.held = threading.Event()

    @staticmethod
    def texts(message) -> list[str]:
        content = message.get("content")
        if isinstance(content, str):
            return [content]
        return [b.get("text", "") for b in content or [] if b.get("type") == "text"]

    def __call__(self, request):
        if DELEGATE not in request.tool_names:
            return Text("ok")  # the CLI's side requests (titles, summaries)
        level = int(re.search(r"task L(\d+)", " ".join(self.texts(request.messages[0])))[1])
        last = request.messages[-1]
        steer = [t for t in self.texts(last) if "STEER:" in t] if last["role"] == "user" else []
        if steer:
            heard = steer[0].split("STEER:", 1)[1].strip().splitlines()[0]
            return Text(f"L{level} heard: {heard}")
        if not any(u.get("name") == DELEGATE for u in request.tool_uses):
            if level == self.hold_level:
                self.held.set()
                self.released.wait(120)
            return ToolCall(
                DELEGATE,
                {"profile": "claude", "message": f"task L{level + 1}", "waitSeconds": 50},
                text=f"L{level} delegating.",
            )
        (result,) = request.tool_results
        said = request.tool_result_text(result)
        if result.get("is_error"):
            return Text(f"L{level} did it itself (refused: {said[:200]})")
        return Text(f"L{level} done; child said: {said[:100]}")


def api(server, token, method, path, body=None):
    request = urllib.request.Request(
        server.http_url + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. A zombie does not: a sandbox's init
    ends after bwrap and waits for the machine's init to reap it."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != b"Z":
                return True
    return False


async def wait_for(check, timeout=90, what="condition"):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := await check()):
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return value


def runs_by_depth(root_id) -> dict[int, Run]:
    root = Run.objects.get(run_id=root_id)
    runs = [root, *Run.objects.filter(root=root)]
    return {run.depth: run for run in runs}


def events_of(run) -> list[Event]:
    return list(Event.objects.filter(run=run).order_by("sequence"))


def check_capped_tree(root_id):
    by_depth = runs_by_depth(root_id)
    if os.environ.get("TREE_DEBUG"):
        for depth, run in sorted(by_depth.items()):
            for e in events_of(run):
                print(
                    depth, e.sequence, e.created_at.time(), e.kind, (e.text or e.error or "")[:80]
                )
    assert sorted(by_depth) == list(range(MAX_DEPTH + 1))  # the tree reached MaxDepth ...
    for depth, run in by_depth.items():
        assert run.status == "succeeded", (depth, run.error)
        if depth:
            assert run.via == "mcp" and run.parent.depth == depth - 1
        events = events_of(run)
        kinds = [e.kind for e in events]
        uses = [e for e in events if e.kind == "tool-use" and e.tool_name == DELEGATE]
        assert len(uses) == 1, kinds
        results = [e for e in events if e.kind == "tool-result"]
        assert [r.tool_call_id for r in results] == [uses[0].tool_call_id]
        usage = [e for e in events if e.kind == "usage"]
        assert usage and all(u.input["costUsd"] > 0 for u in usage), kinds
        assert "result" in kinds and run.output.startswith(f"L{depth}")
    # ... and the next level was refused: the deepest model got the refusal as a tool
    # error, and its own stream shows delegation-refused.
    deepest = by_depth[MAX_DEPTH]
    events = events_of(deepest)
    assert "delegation-refused" in [e.kind for e in events]
    refused = next(e for e in events if e.kind == "tool-result")
    assert refused.success is False
    assert deepest.output.startswith(f"L{MAX_DEPTH} did it itself (refused:")
    assert "-32010" in deepest.output or "depth" in deepest.output.lower()
    assert Run.objects.filter(depth__gt=MAX_DEPTH).count() == 0
    # The steered parent answered the steer in a second turn, after its child's answer.
    assert by_depth[MAX_DEPTH - 1].output == "L1 heard: mention the parser"


class Tree(AgentTree):
    """An :class:`AgentTree` of the ``claude`` preset on its own scripted model: it records
    each process's group, the children's run tokens and every argv while they run."""

    def __init__(self, server, tmp_path, script):
        self.tmp_path, self.script = tmp_path, script
        self.server = server

    async def __aenter__(self):
        self.stub = ModelStub(self.script).__enter__()
        preset = offline_claude_preset(self.stub.url, self.tmp_path / "home")
        engine = CommandEngine([CommandPreset.from_config(preset)], str(self.tmp_path))
        super().__init__(self.server, engine, "claude-tree")
        return await super().__aenter__()

    async def __aexit__(self, *exc):
        self.script.released.set()
        await super().__aexit__(*exc)
        self.stub.__exit__(None, None, None)


async def test_it_grows_a_capped_tree_of_claude_code_processes_that_delegate_through_mcp(
    daphne_factory, tmp_path, operator_token
):
    server = daphne_factory(DELEGATION_MAX_DEPTH=str(MAX_DEPTH))
    script = TreeScript(hold_level=MAX_DEPTH)
    async with Tree(server, tmp_path, script) as tree:
        root = await tree.host.open_root("task L0", profile="claude")
        # While the deepest Claude Code waits on its model, its parent is steered: the steer
        # reaches that running process as its conversation's next turn.
        await wait_for(lambda: asyncio.to_thread(script.held.is_set), what="the deepest turn")
        by_depth = await sync_to_async(runs_by_depth)(root.run_id)
        middle = by_depth[MAX_DEPTH - 1]
        steer = await asyncio.to_thread(
            api,
            server,
            operator_token,
            "POST",
            f"/api/runs/{middle.run_id}/steer",
            {"requestId": "steer-1", "message": "STEER: mention the parser"},
        )
        assert steer["outcome"] == "injected", steer
        script.released.set()
        await tree.host.wait(root.run_id, timeout=180)

        await sync_to_async(check_capped_tree)(root.run_id)
        # Every process of the tree is gone, its MCP config file with it.
        assert len(tree.pids) == MAX_DEPTH + 1
        assert not [pid for pid in tree.pids.values() if group_alive(pid)]
        assert not list(tmp_path.glob("canopy-mcp-*"))
        # No child's run token on any argv while it ran, in the server's log or in any
        # stored event.
        assert tree.tokens and not await sync_to_async(tree.leaked)()


async def test_it_stops_every_claude_code_process_when_an_operator_cancels_the_root(
    daphne_factory, tmp_path, operator_token
):
    server = daphne_factory(DELEGATION_MAX_DEPTH=str(MAX_DEPTH))
    script = TreeScript(hold_level=MAX_DEPTH)  # the deepest model never answers
    async with Tree(server, tmp_path, script) as tree:
        root = await tree.host.open_root("task L0", profile="claude")
        await wait_for(lambda: asyncio.to_thread(script.held.is_set), what="the deepest turn")
        assert len(tree.pids) == MAX_DEPTH + 1
        assert all(group_alive(pid) for pid in tree.pids.values())
        answer = await asyncio.to_thread(
            api,
            server,
            operator_token,
            "POST",
            f"/api/runs/{root.run_id}/cancel",
            {"reason": "runaway tree", "cascade": True},
        )
        assert answer, answer
        await wait_for(
            lambda: asyncio.to_thread(lambda: not any(map(group_alive, tree.pids.values()))),
            timeout=60,
            what="every Claude Code process to stop",
        )

        def statuses():
            return sorted({r.status for r in runs_by_depth(root.run_id).values()})

        # Each run is reported cancelled once its process is gone (a moment after).
        await wait_for(
            lambda: sync_to_async(lambda: "running" not in statuses())(),
            timeout=30,
            what="every run to finish",
        )
        assert await sync_to_async(statuses)() == ["cancelled"]

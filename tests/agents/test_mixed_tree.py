"""A mixed tree of real agent CLIs (issue 23, SPEC §9/§10), offline: one runner offers the
``claude``, ``codex`` and ``gemini`` presets; the Claude Code root delegates to a Codex child
and to a Gemini child, the Gemini child delegates again, and its Gemini grandchild is refused
at the depth cap (−32010, ``delegation-refused``). Each CLI talks to its own scripted model
endpoint; the subtree cost REST reports is the sum of the runs' own costs, Claude's reported
by the agent and Codex's and Gemini's priced from the table."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from asgiref.sync import sync_to_async

from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.model_stub import ModelStub, Text, ToolCall
from tests.agents.test_codex import codex_preset
from tests.agents.test_gemini import gemini_preset
from tests.support.agents.delegating import (
    AgentTree,
    DelegateScript,
    events_of,
    group_alive,
    runs_by_depth,
)
from tests.support.agents.other_clis import CODEX_MODEL, GEMINI_MODEL
from tests.support.agents.wire_stubs import GeminiStub, ResponsesStub
from tests.support.real_agents import offline_claude_preset

MAX_DEPTH = 2
DEPTH_REFUSED = -32010
CLAUDE_DELEGATE = "mcp__canopy__delegate"
CODEX_TOOL = "mcp__canopy__list_profiles"  # the Codex child uses a tool but spawns nothing
GEMINI_DELEGATE = "mcp_canopy_delegate"


def root_script(request):
    """The Claude Code root: delegate to Codex, then to Gemini, then answer with both."""
    if CLAUDE_DELEGATE not in request.tool_names:
        return Text("ok")  # the CLI's side requests (titles, summaries)
    done = [u for u in request.tool_uses if u.get("name") == CLAUDE_DELEGATE]
    if len(done) < 2:
        profile = ("codex", "gemini")[len(done)]
        args = {"profile": profile, "message": "task L1", "waitSeconds": 50}
        return ToolCall(CLAUDE_DELEGATE, args, text=f"L0 delegating to {profile}.")
    said = [request.tool_result_text(r)[:80] for r in request.tool_results]
    return Text(f"L0 done; children said: {said}")


def codex_script(request):
    """The Codex child: one look at the profiles through Canopy's MCP, then an answer."""
    if CODEX_TOOL not in request.tool_names:
        return Text("ok")
    if not any(u.get("name") == CODEX_TOOL for u in request.tool_uses):
        return ToolCall(CODEX_TOOL, {}, text="L1 looking at the profiles.")
    return Text("L1 codex did it itself.")


class Heard:
    """``script``, remembering every tool result its model was sent."""

    def __init__(self, script):
        self.script = script
        self.results: list[str] = []

    def __call__(self, request):
        self.results += [request.tool_result_text(r) for r in request.tool_results]
        return self.script(request)


def api_get(server, token, path):
    request = urllib.request.Request(
        server.http_url + path, headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def check_tree(root_id):
    by_depth = runs_by_depth(root_id)
    assert sorted(by_depth) == list(range(MAX_DEPTH + 1)), by_depth
    (root,) = by_depth[0]
    assert root.profile == "claude"
    assert sorted(r.profile for r in by_depth[1]) == ["codex", "gemini"]
    (grandchild,) = by_depth[2]
    gemini_child = next(r for r in by_depth[1] if r.profile == "gemini")
    assert grandchild.profile == "gemini" and grandchild.parent_id == gemini_child.pk
    expected_tools = {"claude": 2, "codex": 1, "gemini": 1}
    for depth, runs in by_depth.items():
        for run in runs:
            events = events_of(run)
            kinds = [e.kind for e in events]
            assert run.status == "succeeded", (depth, run.profile, run.error, kinds)
            if depth:
                assert run.via == "mcp" and run.parent.depth == depth - 1
            uses = [e for e in events if e.kind == "tool-use"]
            results = [e for e in events if e.kind == "tool-result"]
            assert len(uses) == expected_tools[run.profile], (run.profile, kinds)
            # Each of the agent's tool uses is paired with its result by the agent's own id.
            assert all(u.tool_call_id for u in uses), kinds
            assert [r.tool_call_id for r in results] == [u.tool_call_id for u in uses]
            assert [e for e in events if e.kind == "usage"], (run.profile, kinds)
            # codex exec --json ends with its last agent message, no result record.
            assert run.profile == "codex" or "result" in kinds, (run.profile, kinds)
            assert run.output.startswith(f"L{depth}"), run.output
    # The grandchild, at the cap, was refused: a delegation-refused event on its own stream
    # and a failed tool result (the −32010 its model got is checked from the stub), and no
    # run is deeper than the cap (the depths above).
    events = events_of(grandchild)
    (refused,) = [e for e in events if e.kind == "delegation-refused"]
    assert refused.data["profile"] == "gemini" and "depth" in refused.error.lower(), refused.error
    (result,) = [e for e in events if e.kind == "tool-result"]
    # Its tool call failed after the refusal was recorded (Gemini's MCP call carries no
    # tool-call id for the refusal to name); Gemini joins its turns' texts in its output.
    assert refused.sequence < result.sequence and result.success is False
    assert f"L{MAX_DEPTH} did it itself (refused:" in grandchild.output, grandchild.output
    # The Gemini child's delegate succeeded (its answer quotes the grandchild's refusal, so
    # its output is no proof of that).
    (spawned,) = [e for e in events_of(gemini_child) if e.kind == "tool-result"]
    assert spawned.success is True and grandchild.run_id in str(spawned.tool_output), spawned
    return {r.run_id: r.profile for runs in by_depth.values() for r in runs}


def check_costs(server, token, profiles: dict[str, str], root_id: str):
    """Each run's own cost from its usage events (REST), its source by agent; the root's
    subtree cost (REST) is their sum."""
    own = {}
    for run_id, profile in profiles.items():
        items = api_get(server, token, f"/api/runs/{run_id}/events?limit=1000")["items"]
        usage = [e["input"] for e in items if e["kind"] == "usage"]
        assert usage, (profile, [e["kind"] for e in items])
        sources = {u["costSource"] for u in usage}
        if profile == "claude":
            # Claude Code reports its cost in its result line.
            assert sources == {"agent"}, usage
        else:
            # Codex (its command line names the model) and Gemini (its stream names it)
            # report none: the table prices them.
            assert sources == {"table"}, usage
            model = CODEX_MODEL if profile == "codex" else GEMINI_MODEL
            assert {u["model"] for u in usage} == {model}, usage
        assert all(float(u["costUsd"]) > 0 for u in usage), usage
        own[run_id] = sum(float(u["costUsd"]) for u in usage)
        detail = api_get(server, token, f"/api/runs/{run_id}")
        assert abs(detail["usage"]["own"]["costUsd"] - own[run_id]) < 1e-9, (profile, detail)
    root = api_get(server, token, f"/api/runs/{root_id}")
    subtree = root["usage"]["subtree"]
    assert subtree["runs"]["total"] == len(profiles) == 4, subtree
    assert abs(subtree["costUsd"] - sum(own.values())) < 1e-9, (subtree, own)


@pytest.mark.usefixtures("no_declared_level", "close_worker_connections", "shipped_prices")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
async def test_it_grows_a_mixed_tree_of_claude_codex_and_gemini_priced_by_agent_and_table(
    daphne_factory, tmp_path, operator_token
):
    server = daphne_factory(DELEGATION_MAX_DEPTH=str(MAX_DEPTH))
    gemini = Heard(DelegateScript(GEMINI_DELEGATE, "gemini"))
    with (
        ModelStub(root_script) as claude_stub,
        ResponsesStub(codex_script) as codex_stub,
        GeminiStub(gemini) as gemini_stub,
    ):
        presets = [
            offline_claude_preset(claude_stub.url, tmp_path / "home"),
            codex_preset(codex_stub.url),
            gemini_preset(gemini_stub.url),
        ]
        engine = CommandEngine([CommandPreset.from_config(p) for p in presets], str(tmp_path))
        async with AgentTree(server, engine, "mixed-tree") as tree:
            root = await tree.host.open_root("task L0", profile="claude")
            await tree.host.wait(root.run_id, timeout=240)
            profiles = await sync_to_async(check_tree)(root.run_id)
            # The grandchild's model got the refusal with its §6 code.
            assert [r for r in gemini.results if str(DEPTH_REFUSED) in r], gemini.results
            await asyncio.to_thread(check_costs, server, operator_token, profiles, root.run_id)
            # Four processes, one per run, all gone; no child's run token on any argv, in
            # the server's log or in any stored event.
            assert len(tree.pids) == 4 and not any(map(group_alive, tree.pids.values()))
            assert len(tree.tokens) >= 3 and not await sync_to_async(tree.leaked)()
        assert codex_stub.unknown == []
        assert not claude_stub.script_errors
        assert not codex_stub.script_errors and not gemini_stub.script_errors
    assert not list(tmp_path.glob("canopy-*"))

"""Gemini CLI through the acp engine (``gemini --acp``, the pinned CLI), offline on the
scripted Gemini endpoint: Canopy's ``/mcp`` reaches it in ``session/new`` and a tree of real
Gemini ACP processes delegates to the depth cap."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from delegation.runner.acp import AcpEngine, AcpPreset
from tests.support.agents.claude_cli import allow_model
from tests.support.agents.delegating import (
    AgentTree,
    DelegateScript,
    check_cancel_leaves_no_process,
    events_of,
    group_alive,
    runs_by_depth,
)
from tests.support.agents.other_clis import GEMINI_MODEL, agent_bin, gemini_env
from tests.support.agents.wire_stubs import GeminiStub

DELEGATE = "mcp_canopy_delegate"


def check_tree(root_id):
    by_depth = runs_by_depth(root_id)
    assert sorted(by_depth) == [0, 1]
    for depth, (run,) in by_depth.items():
        kinds = [e.kind for e in events_of(run)]
        assert run.status == "succeeded", (depth, run.error, kinds)
        # Gemini announces its MCP call through the permission request (answered by the
        # preset's policy), then its result, both with Gemini's own tool call id.
        (asked,) = [e for e in events_of(run) if e.kind == "permission"]
        (result,) = [e for e in events_of(run) if e.kind == "tool-result"]
        assert asked.tool_call_id == result.tool_call_id and result.tool_call_id, kinds
        assert run.output.startswith(f"L{depth}"), run.output
    child = by_depth[1][0]
    assert child.via == "mcp" and "delegation-refused" in [e.kind for e in events_of(child)]


def gemini_acp_preset(model_url: str) -> AcpPreset:
    return AcpPreset(
        "gemini",
        [agent_bin("gemini"), "--acp", "--model", GEMINI_MODEL],
        # A sandboxed child's workspace is the runner's to trust (Gemini disables MCP
        # servers in a folder it does not trust).
        env={**gemini_env(model_url), "GEMINI_CLI_TRUST_WORKSPACE": "true"},
        allow_tool_kinds=("execute", "other", "fetch", "read"),
        allow_hosts=tuple(allow_model(model_url)),
    )


@pytest.mark.usefixtures("no_declared_level", "close_worker_connections")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
async def test_it_runs_real_gemini_acp_children_that_delegate_through_mcp(daphne_factory, tmp_path):
    server = daphne_factory(DELEGATION_MAX_DEPTH="1")
    with GeminiStub(DelegateScript(DELEGATE, "gemini")) as stub:
        engine = AcpEngine([gemini_acp_preset(stub.url)], str(tmp_path))
        async with AgentTree(server, engine, "gemini-acp") as tree:
            root = await tree.host.open_root("task L0", profile="gemini")
            await tree.host.wait(root.run_id, timeout=150)
            await sync_to_async(check_tree)(root.run_id)
            assert tree.pids and not any(map(group_alive, tree.pids.values()))
            assert tree.tokens and not await sync_to_async(tree.leaked)()
        assert not stub.script_errors


@pytest.mark.usefixtures("no_declared_level", "close_worker_connections")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
async def test_it_cancels_a_real_gemini_acp_child_leaving_no_process(daphne_factory, tmp_path):
    server = daphne_factory()
    script = DelegateScript(DELEGATE, "gemini", hold=0)  # its model never answers
    with GeminiStub(script) as stub:
        engine = AcpEngine([gemini_acp_preset(stub.url)], str(tmp_path))
        async with AgentTree(server, engine, "gemini-acp-cancel") as tree:
            # ACP queues a steer for its next prompt; once cancelled it takes none.
            await check_cancel_leaves_no_process(tree, script, "gemini", steer="injected")
    assert not list(tmp_path.glob("canopy-*"))

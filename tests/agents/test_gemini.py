"""Gemini CLI as a real child (the pinned CLI from ``make agents``), offline on the scripted
Gemini endpoint: ``gemini-stream-json`` on its recorded output, and a tree of real Gemini
processes delegating through ``/mcp`` (settings in the child's private HOME) to the cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.formats import make_format
from tests.support.agents.claude_cli import allow_model
from tests.support.agents.delegating import (
    AgentTree,
    DelegateScript,
    check_cancel_leaves_no_process,
    check_capped_pair,
    group_alive,
)
from tests.support.agents.other_clis import GEMINI_MODEL, agent_bin, gemini_env
from tests.support.agents.wire_stubs import GeminiStub
from tests.support.real_agents import readme_presets

RECORDED = Path(__file__).resolve().parents[1] / "support/agents/recorded/gemini-stream-json"
DELEGATE = "mcp_canopy_delegate"


def test_it_maps_gemini_clis_recorded_tool_call():
    fmt = make_format("gemini-stream-json")
    lines = (RECORDED / "tool-call.jsonl").read_text().splitlines()
    events = [ev for line in lines for ev in fmt.feed(line)] + fmt.flush()
    kinds = [e["kind"] for e in events]
    assert kinds == [
        "session",
        "user",
        "text",
        "tool-use",
        "tool-result",
        "text",
        "usage",
        "result",
    ]
    use, result = events[3], events[4]
    assert use["toolCallId"] == result["toolCallId"] and result["success"] is True
    assert events[6]["input"]["model"] == GEMINI_MODEL and "costUsd" not in events[6]["input"]


def gemini_preset(model_url: str, **changes) -> dict:
    preset = next(p for p in readme_presets()["presets"] if p["name"] == "gemini")
    preset = json.loads(json.dumps(preset))
    preset["command"][0] = agent_bin("gemini")
    preset["command"][1:1] = ["--model", GEMINI_MODEL]
    preset["env"] = {**preset.get("env", {}), **gemini_env(model_url)}
    preset["allowHosts"] = allow_model(model_url)
    preset.update(changes)
    return preset


def check_tree(root_id):
    for _run, _events, usage in check_capped_pair(root_id, DELEGATE).values():
        assert usage == [{**usage[0], "model": GEMINI_MODEL, "costSource": "table"}]


@pytest.mark.usefixtures("no_declared_level", "close_worker_connections", "shipped_prices")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
async def test_it_runs_a_tree_of_real_gemini_processes_that_delegate_through_mcp(
    daphne_factory, tmp_path
):
    server = daphne_factory(DELEGATION_MAX_DEPTH="1")
    with GeminiStub(DelegateScript(DELEGATE, "gemini")) as stub:
        engine = CommandEngine([CommandPreset.from_config(gemini_preset(stub.url))], str(tmp_path))
        async with AgentTree(server, engine, "gemini-tree") as tree:
            root = await tree.host.open_root("task L0", profile="gemini")
            await tree.host.wait(root.run_id, timeout=150)
            await sync_to_async(check_tree)(root.run_id)
            assert len(tree.pids) == 2 and not any(map(group_alive, tree.pids.values()))
            assert tree.tokens and not await sync_to_async(tree.leaked)()
        assert not stub.script_errors
    assert not list(tmp_path.glob("canopy-*"))


@pytest.mark.usefixtures("no_declared_level", "close_worker_connections")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
async def test_it_cancels_a_real_gemini_child_leaving_no_process_and_refuses_its_steer(
    daphne_factory, tmp_path
):
    server = daphne_factory()
    script = DelegateScript(DELEGATE, "gemini", hold=0)  # its model never answers
    with GeminiStub(script) as stub:
        preset = CommandPreset.from_config(gemini_preset(stub.url, cancelGraceSeconds=2))
        engine = CommandEngine([preset], str(tmp_path))
        async with AgentTree(server, engine, "gemini-cancel") as tree:
            await check_cancel_leaves_no_process(tree, script, "gemini")
    assert not list(tmp_path.glob("canopy-*"))

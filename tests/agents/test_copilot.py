"""GitHub Copilot CLI as a real child (the pinned CLI from ``make agents``), offline on the
scripted Anthropic endpoint: ``copilot-json`` on the CLI's recorded output, and a tree of real
Copilot processes delegating through Canopy's ``/mcp`` until the depth cap refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.formats import make_format
from delegation.runner.model_stub import ModelStub
from tests.support.agents.claude_cli import allow_model
from tests.support.agents.delegating import (
    AgentTree,
    DelegateScript,
    check_cancel_leaves_no_process,
    check_capped_pair,
    group_alive,
)
from tests.support.agents.other_clis import COPILOT_MODEL, agent_bin, copilot_env
from tests.support.real_agents import readme_presets

RECORDED = Path(__file__).resolve().parents[1] / "support" / "agents" / "recorded" / "copilot-json"
DELEGATE = "canopy-delegate"


def replay(name: str):
    fmt = make_format("copilot-json")
    lines = (RECORDED / f"{name}.jsonl").read_text().splitlines()
    events = [ev for line in lines for ev in fmt.feed(line)] + fmt.flush()
    usage = RECORDED / f"{name}.usage.json"
    if usage.exists():
        events += fmt.usage_file(usage.read_text())
    return fmt, lines, events


def test_it_maps_copilots_recorded_tool_call_to_structured_events():
    fmt, lines, events = replay("tool-call")
    kinds = [e["kind"] for e in events]
    assert kinds == ["user", "text", "tool-use", "tool-result", "text", "result", "usage"]
    use, result = events[2], events[3]
    assert use["toolName"] == "toy-echo" and use["input"] == {"text": "hello canopy"}
    assert result["toolCallId"] == use["toolCallId"] and use["toolCallId"].startswith("toolu_")
    assert result["success"] is True and "echo: hello canopy" in result["toolOutput"]
    assert events[5]["text"].startswith("The tool said: echo: hello canopy")
    usage = events[6]["input"]
    assert usage["model"] == COPILOT_MODEL and usage["inputTokens"] > 0
    assert "costUsd" not in usage  # Copilot reports no dollars: the server's table prices it
    # The ephemeral records (deltas, MCP status, model-call bookkeeping) are not events.
    ephemeral = [line for line in lines if '"ephemeral":true' in line]
    assert len(ephemeral) > 10 and len(events) < len(lines) - len(ephemeral)
    assert fmt.outcome(0).output == events[5]["text"]


def test_it_maps_copilots_recorded_failures():
    _fmt, _lines, events = replay("tool-error")
    (result,) = [e for e in events if e["kind"] == "tool-result"]
    assert result["success"] is False and "toy failure: no such child" in result["error"]
    fmt, _lines, events = replay("model-500")
    assert fmt.outcome(1).error.startswith("Failed to get response from the AI model")
    assert "result" not in [e["kind"] for e in events]


def copilot_preset(model_url: str, **changes) -> dict:
    preset = next(p for p in readme_presets()["presets"] if p["name"] == "copilot")
    preset = json.loads(json.dumps(preset))
    preset["command"][0] = agent_bin("copilot")
    preset["env"] = {**preset.get("env", {}), **copilot_env(model_url)}
    preset["allowHosts"] = allow_model(model_url)
    preset.update(changes)
    return preset


def check_tree(root_id):
    tree = check_capped_pair(root_id, DELEGATE)
    for _run, events, usage in tree.values():
        kinds = [e.kind for e in events]
        assert usage[0]["model"] == COPILOT_MODEL, kinds
        # Copilot reports tokens but no dollars: priced from the shipped table.
        assert usage[0]["costSource"] == "table" and usage[0]["costUsd"] > 0
        assert "result" in kinds and kinds.count("text") <= 3, kinds  # no delta each
    assert tree[1][0].output.startswith("L1 did it itself (refused:")
    assert "-32010" in tree[1][0].output or "depth" in tree[1][0].output.lower()


@pytest.mark.usefixtures("no_declared_level", "close_worker_connections", "shipped_prices")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
async def test_it_runs_a_tree_of_real_copilot_processes_that_delegate_through_mcp(
    daphne_factory, tmp_path
):
    server = daphne_factory(DELEGATION_MAX_DEPTH="1")
    script = DelegateScript(DELEGATE, "copilot")
    with ModelStub(script) as stub:
        preset = CommandPreset.from_config(copilot_preset(stub.url))
        engine = CommandEngine([preset], str(tmp_path))
        async with AgentTree(server, engine, "copilot-tree") as tree:
            root = await tree.host.open_root("task L0", profile="copilot")
            await tree.host.wait(root.run_id, timeout=150)
            await sync_to_async(check_tree)(root.run_id)
            assert len(tree.pids) == 2 and not any(map(group_alive, tree.pids.values()))
            assert tree.tokens and not tree.leaked_on_argv()
            log = server.log()
            assert not [t for t in tree.tokens if t in log]
    assert not list(tmp_path.glob("canopy-*"))


@pytest.mark.usefixtures("no_declared_level", "close_worker_connections")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
async def test_it_cancels_a_real_copilot_child_leaving_no_process_and_refuses_its_steer(
    daphne_factory, tmp_path
):
    server = daphne_factory()
    script = DelegateScript(DELEGATE, "copilot", hold=0)  # its model never answers
    with ModelStub(script) as stub:
        preset = CommandPreset.from_config(copilot_preset(stub.url, cancelGraceSeconds=2))
        engine = CommandEngine([preset], str(tmp_path))
        async with AgentTree(server, engine, "copilot-cancel") as tree:
            # A -p run reads no steers: the engine says so (the server then marks the receipt).
            await check_cancel_leaves_no_process(tree, script, "copilot")
    assert not list(tmp_path.glob("canopy-*"))

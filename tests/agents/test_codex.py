"""Codex CLI as a real child (the pinned CLI from ``make agents``), offline on the scripted
OpenAI Responses endpoint: a per-child ``CODEX_HOME/config.toml`` names Canopy's ``/mcp``
(the token by environment), and a tree of real Codex processes delegates to the depth cap."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from delegation.runner.command import CommandEngine, CommandPreset
from tests.support.agents.claude_cli import allow_model
from tests.support.agents.delegating import (
    AgentTree,
    DelegateScript,
    check_cancel_leaves_no_process,
    check_capped_pair,
    group_alive,
)
from tests.support.agents.other_clis import (
    CODEX_MODEL,
    STUB_KEY,
    agent_bin,
    codex_provider_args,
)
from tests.support.agents.wire_stubs import ResponsesStub
from tests.support.real_agents import readme_presets

DELEGATE = "mcp__canopy__delegate"  # Codex's namespace mcp__canopy, tool delegate


def codex_preset(model_url: str, **changes) -> dict:
    preset = next(p for p in readme_presets()["presets"] if p["name"] == "codex")
    preset = json.loads(json.dumps(preset))
    command = preset["command"]
    command[0] = agent_bin("codex")
    at = command.index("exec") + 1
    preset["command"] = command[:at] + codex_provider_args(model_url) + command[at:]
    preset["env"] = {**preset.get("env", {}), "STUB_API_KEY": STUB_KEY}
    preset["allowHosts"] = allow_model(model_url)
    preset.update(changes)
    return preset


def check_tree(root_id):
    tree = check_capped_pair(root_id, DELEGATE)
    assert tree[1][0].output.startswith("L1 did it itself (refused:")
    for _run, events, usage in tree.values():
        # codex exec --json names no model: the one its command line names (-c model=...)
        # prices it from the table.
        assert usage[0]["model"] == CODEX_MODEL, usage[0]
        assert usage[0]["costSource"] == "table" and float(usage[0]["costUsd"]) > 0, usage[0]
        # Its "Reading additional input from stdin..." notice informs, it is no error.
        errors = [e.error for e in events if e.kind == "error"]
        assert not [m for m in errors if "Reading additional input" in (m or "")], errors
        logs = [e.text or "" for e in events if e.kind == "log"]
        assert [m for m in logs if m.startswith("Reading additional input")], logs


@pytest.mark.usefixtures("no_declared_level", "close_worker_connections", "shipped_prices")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
async def test_it_runs_a_tree_of_real_codex_processes_that_delegate_through_mcp(
    daphne_factory, tmp_path
):
    server = daphne_factory(DELEGATION_MAX_DEPTH="1")
    script = DelegateScript(DELEGATE, "codex")
    with ResponsesStub(script) as stub:
        engine = CommandEngine([CommandPreset.from_config(codex_preset(stub.url))], str(tmp_path))
        async with AgentTree(server, engine, "codex-tree") as tree:
            root = await tree.host.open_root("task L0", profile="codex")
            await tree.host.wait(root.run_id, timeout=150)
            await sync_to_async(check_tree)(root.run_id)
            assert len(tree.pids) == 2 and not any(map(group_alive, tree.pids.values()))
            assert tree.tokens and not tree.leaked_on_argv()
            assert not [t for t in tree.tokens if t in server.log()]
        # The model never saw a WebSocket attempt (SSE only) and no other path.
        assert stub.unknown == [] and not stub.script_errors
    assert not list(tmp_path.glob("canopy-*"))


@pytest.mark.usefixtures("no_declared_level", "close_worker_connections")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
async def test_it_cancels_a_real_codex_child_leaving_no_process_and_refuses_its_steer(
    daphne_factory, tmp_path
):
    server = daphne_factory()
    script = DelegateScript(DELEGATE, "codex", hold=0)  # its model never answers
    with ResponsesStub(script) as stub:
        preset = CommandPreset.from_config(codex_preset(stub.url, cancelGraceSeconds=2))
        engine = CommandEngine([preset], str(tmp_path))
        async with AgentTree(server, engine, "codex-cancel") as tree:
            await check_cancel_leaves_no_process(tree, script, "codex")
    assert not list(tmp_path.glob("canopy-*"))

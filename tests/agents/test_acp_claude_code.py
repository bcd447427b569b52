"""The acp engine driving the real ``@zed-industries/claude-code-acp`` adapter (pinned by
``make agents``) against the scripted Anthropic Messages endpoint: offline, no key.

A missing adapter fails the test (``claude_cli`` raises), it never skips.
"""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Event, Run
from delegation.runner import model_stub
from delegation.runner.acp import AcpEngine, AcpPreset
from delegation.runner.host import RunnerHost
from delegation.services import tokens
from tests.support.agents import claude_cli
from tests.support.agents.delegating import AgentTree
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
]


def script(request):
    if request.tool_results:
        said = request.tool_result_text(request.tool_results[-1])
        return model_stub.Text(f"The command said: {said.strip()[:80]}")
    return model_stub.ToolCall(
        "Bash", {"command": "echo canopy", "description": "echo"}, text="Running it."
    )


async def test_it_runs_a_child_on_claude_code_acp_offline(daphne_server, tmp_path):
    _runner, token = await sync_to_async(tokens.create_runner)("claude-acp")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with model_stub.ModelStub(script) as stub:
        # Claude Code refuses to skip permission prompts as root unless told it is sandboxed.
        env = claude_cli.offline_env(stub.url, tmp_path / "home", IS_SANDBOX="1")
        preset = AcpPreset(
            "claude",
            [claude_cli.acp_bin()],
            env=env,
            allow_tool_kinds=("execute",),
            allow_hosts=tuple(claude_cli.allow_model(stub.url)),
        )
        engine = AcpEngine([preset], str(workspace))
        host = RunnerHost(
            daphne_server.ws_url, token, engine, extension_id="claude", client_options=FAST
        )
        ext, gen, c = host.extension_id, host.generation, host.client
        async with host:
            await c.open_run("root-conv", "root-run")
            child = await c.child_start(
                "root-run",
                ext,
                gen,
                {"requestId": "r1", "profile": "claude", "message": "run echo canopy"},
            )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 90
            events, after = [], 0
            while True:
                result = await c.child_read("root-run", ext, gen, child.child_id, after=after)
                events.extend(result.events)
                after = result.last_sequence or after
                if result.done and not result.events:
                    break
                assert loop.time() < deadline, [e.raw for e in events]
                await asyncio.sleep(0.1)
            await c.finish("root-run", output="ok")
        assert len(stub.turns) >= 2
    assert result.status == "succeeded", result.error
    assert result.output == "The command said: canopy"
    # Claude Code may try a host of its own first (raw.githubusercontent.com, seen since
    # 2026-12-04): the egress proxy refuses it and says so on the run (SPEC §13), as it should.
    refused = [
        e
        for e in events
        if e.kind == "error" and str(e.raw.get("text")).startswith("network: refused")
    ]
    assert all("127.0.0.1" not in str(e.raw.get("text")) for e in refused), refused
    kinds = [e.kind for e in events if e not in refused]
    assert kinds[0] == "session" and kinds[-1] == "result", [e.raw for e in events][:3]
    use = next(e for e in events if e.kind == "tool-use")
    done = next(e for e in events if e.kind == "tool-result")
    assert use.tool_call_id == done.tool_call_id and use.tool_call_id.startswith("toolu_")
    assert done.success is True and "canopy" in str(done.tool_output)
    assert kinds.count("tool-use") == 1  # announced twice by the adapter, shown once


def delegating_script(request):
    """Level 0 delegates ``task L1`` through Canopy's MCP server; level 1 answers."""
    if "mcp__canopy__delegate" not in request.tool_names:
        return model_stub.Text("ok")  # side requests
    first = request.messages[0]["content"]
    opening = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)
    if "task L1" in opening:
        return model_stub.Text("L1: the parser is fine")
    if not request.tool_results:
        return model_stub.ToolCall(
            "mcp__canopy__delegate",
            {"profile": "claude", "message": "task L1", "waitSeconds": 50},
            text="Delegating.",
        )
    said = request.tool_result_text(request.tool_results[-1])
    return model_stub.Text(
        "L0 heard: " + ("L1: the parser is fine" if "parser is fine" in said else said[:200])
    )


async def delegate_through_mcp(server, tmp_path) -> tuple[str, AgentTree]:
    """A claude-agent-acp root that delegates once through Canopy's ``/mcp``; its root id
    and the :class:`AgentTree` that watched the runs' tokens."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with model_stub.ModelStub(delegating_script) as stub:
        env = claude_cli.offline_env(stub.url, tmp_path / "home", IS_SANDBOX="1")
        # mcpTokenVia env: the header says ${CANOPY_RUN_TOKEN}, which Claude Code expands
        # from the adapter's environment, so its --mcp-config argv holds no token.
        preset = AcpPreset(
            "claude",
            [claude_cli.acp_bin()],
            env=env,
            allow_tool_kinds=("execute", "other"),
            mcp_token_via="env",
            allow_hosts=tuple(claude_cli.allow_model(stub.url)),
        )
        # No mcp= stand-in: the engine asks the server for each run's token (run.mcpToken).
        engine = AcpEngine([preset], str(workspace))
        async with AgentTree(server, engine, "claude-acp-mcp") as tree:
            root = await tree.host.open_root("task L0", profile="claude")
            await tree.host.wait(root.run_id, timeout=150)
    return root.run_id, tree


async def test_it_lets_claude_code_acp_delegate_through_canopys_mcp_server(daphne_server, tmp_path):
    root_id, tree = await delegate_through_mcp(daphne_server, tmp_path)
    # No run token in the server's log, in any stored event or on any argv.
    found = await sync_to_async(tree.leaked)()
    assert tree.tokens and not found, found
    runs = await sync_to_async(
        lambda: {r.depth: r for r in Run.objects.select_related("parent").all()}
    )()
    assert sorted(runs) == [0, 1]
    assert runs[0].status == "succeeded", runs[0].error
    assert runs[0].output == "L0 heard: L1: the parser is fine"
    assert (runs[1].status, runs[1].via, runs[1].parent.run_id) == ("succeeded", "mcp", root_id)
    events = await sync_to_async(
        lambda: list(Event.objects.filter(run=runs[0]).order_by("sequence"))
    )()
    use = next(e for e in events if e.kind == "tool-use")
    done = next(e for e in events if e.kind == "tool-result" and e.tool_call_id == use.tool_call_id)
    assert "delegate" in (use.tool_name or "") and done.success is True


async def test_it_keeps_the_run_tokens_off_claude_code_acps_argv(daphne_server, tmp_path):
    _root_id, tree = await delegate_through_mcp(daphne_server, tmp_path)
    assert tree.tokens and not tree.leaked_on_argv()

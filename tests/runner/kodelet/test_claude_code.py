"""A real Claude Code root (the pinned CLI, offline: the only stand-in is the model endpoint)
calls kodelet-subagent's ``spawn_agent`` and ``wait_agent`` through Canopy's ``/mcp``; the
agent it spawns is a Canopy child at depth 1, itself a real Claude Code process (SPEC §15)."""

from __future__ import annotations

import json
import re
import sys

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Run
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from delegation.runner.kodelet.engine import host_extensions
from delegation.runner.model_stub import ModelRequest, ModelStub, Text, ToolCall
from delegation.services import tokens
from tests.support import runners
from tests.support.real_agents import offline_claude_preset

pytestmark = [
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]

SPAWN, WAIT = "mcp__canopy__spawn_agent", "mcp__canopy__wait_agent"
LEAD_TASK = "LEAD: have a background agent say hello, then report what it said."


def script(request: ModelRequest):
    if not any(name.startswith("mcp__canopy__") for name in request.tool_names):
        return Text("ok")  # the CLI's side requests (titles, summaries)
    if "LEAD" not in request.first_text:
        return Text("Hello from the background agent.")
    done = {use.get("name") for use in request.tool_uses}
    if SPAWN not in done:
        task = "Say hello."
        return ToolCall(SPAWN, {"name": "greeter", "task": task, "context_mode": "fresh"})
    if WAIT not in done:
        spawned = request.tool_result_text(request.tool_results[-1])
        # The tool's text, or its structuredContent as JSON: Claude Code shows either.
        found = re.search(r'"agent_id":\s*"([^"]+)"', spawned) or re.search(
            r"Spawned agent '[^']+' \(([^)]+)\)", spawned
        )
        if found is None:
            return Text(f"NO AGENT ID IN: {spawned[:500]}")
        agent_id = found[1]
        return ToolCall(WAIT, {"agent_id": agent_id, "timeout_ms": 120000})
    said = request.tool_result_text(request.tool_results[-1])
    return Text(f"The agent said: {said}")


async def test_it_lets_a_claude_code_root_spawn_and_wait_on_a_kodelet_subagent(
    daphne_server, tmp_path
):
    _runner, token = await sync_to_async(tokens.create_runner)("claude-kodelet")
    with ModelStub(script) as stub:
        child = offline_claude_preset(stub.url, tmp_path / "home")
        lead = json.loads(json.dumps(child))
        lead["name"] = "lead"
        allowed = lead["command"].index("--allowedTools") + 1
        lead["command"][allowed] += f",{SPAWN},{WAIT}"
        lead["extensions"] = [
            {"command": [sys.executable, "-m", "kodelet_subagent"], "childProfile": "claude"}
        ]
        engine = host_extensions(
            CommandEngine(
                [CommandPreset.from_config(lead), CommandPreset.from_config(child)], str(tmp_path)
            )
        )
        options = {**runners.FAST, "call_timeout": 60}
        async with RunnerHost(
            daphne_server.ws_url, token, engine, extension_id="claude", client_options=options
        ) as host:
            root = await host.open_root(LEAD_TASK, profile="lead")
            await host.wait(root.run_id, timeout=200)
    runs = await sync_to_async(
        lambda: list(
            Run.objects.filter(root__run_id=root.run_id)
            .select_related("session")
            .values_list("session__profile", "depth", "status", "output")
        )
    )()
    lead_run = await sync_to_async(Run.objects.get)(run_id=root.run_id)
    assert lead_run.status == "succeeded", lead_run.error
    assert "Hello from the background agent." in lead_run.output
    assert [r for r in runs if r[1] == 1] == [
        ("claude", 1, "succeeded", "Hello from the background agent.")
    ], runs

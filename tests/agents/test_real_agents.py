"""Real Claude Code processes as children of the command engine, offline: the README's
``claude`` preset on the pinned CLI (``make agents``) against the scripted model endpoint,
with a real daphne server and the reference runner host."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from delegation.client import McpToken
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from delegation.runner.mcpconfig import McpConfigFile
from delegation.runner.model_stub import ModelStub, Text
from delegation.runner.presets import load_config
from delegation.services import tokens
from tests.support.agents.toy_mcp import ToyMCP
from tests.support.paths import PROJECT
from tests.support.real_agents import offline_claude_preset, readme_presets
from tests.support.runners import FAST, pid_alive

pytestmark = pytest.mark.usefixtures("no_declared_level", "close_worker_connections")


def test_it_loads_every_readme_preset_with_the_runners_own_loader(tmp_path):
    config = readme_presets()
    path = tmp_path / "agents.json"
    path.write_text(json.dumps(config))
    engine = CommandEngine.from_config(load_config(path))
    presets = engine.presets_by_name
    assert sorted(presets) == ["claude", "codex", "copilot", "gemini"]
    assert engine.workspace == str(tmp_path)
    claude, codex, gemini = presets["claude"], presets["codex"], presets["gemini"]
    assert (claude.format, claude.steer_format) == ("claude-stream-json", "claude-stream-json")
    assert claude.uses_mcp_config
    command = claude.command
    assert command[command.index("--mcp-config") + 1] == "{mcpConfig}"
    assert "--strict-mcp-config" in command and "--input-format" in command
    assert codex.format == "codex-json" and codex.command[:3] == ["codex", "exec", "--json"]
    assert codex.mcp_config_shape == "codex" and codex.uses_mcp_config
    assert gemini.format == "gemini-stream-json"
    assert gemini.env["GEMINI_CLI_SYSTEM_SETTINGS_PATH"] == "{mcpConfig}"
    assert gemini.mcp_config_shape == "gemini" and claude.mcp_config_shape == "claude"
    copilot = presets["copilot"]
    assert (copilot.format, copilot.steer_format) == ("copilot-json", "none")
    assert "@{mcpConfig}" in copilot.command and copilot.uses_usage_file
    # No preset puts anything but the placeholder where the token would go.
    assert "Bearer" not in path.read_text()


def test_it_writes_each_agents_shape_of_the_mcp_server_entry():
    token = McpToken(url="http://canopy.test/mcp", token="cnt_x")
    headers = {"Authorization": "Bearer cnt_x", "X-Pando-Delegation-Depth": "3"}
    files = {shape: McpConfigFile(token, 3, shape=shape) for shape in ("claude", "gemini")}
    try:
        written = {s: json.loads(Path(f.path).read_text()) for s, f in files.items()}
    finally:
        for f in files.values():
            f.remove()
    assert written["claude"] == {
        "mcpServers": {"canopy": {"type": "http", "url": token.url, "headers": headers}}
    }
    assert written["gemini"]["mcpServers"] == {"canopy": {"httpUrl": token.url, "headers": headers}}
    assert written["gemini"]["security"]["folderTrust"] == {"enabled": False}
    assert not any(Path(f.directory).exists() for f in files.values())
    with pytest.raises(ValueError, match="'mcpConfigShape' must be one of claude, gemini, codex"):
        CommandPreset.from_config({"name": "x", "command": ["true"], "mcpConfigShape": "toml"})


def test_it_refuses_a_claude_conversation_steer_without_its_format():
    with pytest.raises(ValueError, match="'steerFormat' 'claude-stream-json' needs 'format'"):
        CommandPreset.from_config(
            {"name": "x", "command": ["true"], "steerFormat": "claude-stream-json"}
        )


class Slow:
    """First turn: wait until released (a steer arrives meanwhile); then answer what was said."""

    def __init__(self, hold: float):
        self.hold = hold

    def __call__(self, request):
        if not request.tool_names:
            return Text("ok")  # the CLI's side requests
        texts = [b.get("text", "") for b in request.blocks("text")]
        if any("STEER:" in t for t in texts):
            steer = next(t for t in texts if "STEER:" in t)
            return Text(f"heard {steer.split('STEER:', 1)[1].strip()}")
        time.sleep(self.hold)
        return Text("first answer")


async def wait_for(predicate, timeout=60, what="condition"):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := await predicate()):
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return value


@pytest.mark.django_db(transaction=True)
async def test_it_steers_and_cancels_real_claude_code_children(daphne_server, tmp_path):
    _runner, token = await sync_to_async(tokens.create_runner)("claude-runner")
    with ModelStub(Slow(hold=4.0)) as stub, ToyMCP() as toy:

        async def mcp(ctx):  # the real /mcp is exercised by the tree test
            return {"url": toy.url, "token": f"run-token-{ctx.run_id}"}

        engine = CommandEngine(
            [CommandPreset.from_config(offline_claude_preset(stub.url, tmp_path / "home"))],
            str(tmp_path),
            mcp=mcp,
        )
        host = RunnerHost(
            daphne_server.ws_url, token, engine, extension_id="claude", client_options=FAST
        )
        ext, gen, c = host.extension_id, host.generation, host.client

        async def child_result(child_id):
            return await c.child_read("root-run", ext, gen, child_id)

        async with host:
            await c.open_run("root-conv", "root-run")
            # A steer during the first (slow) turn becomes the conversation's next turn.
            child = await c.child_start(
                "root-run", ext, gen, {"requestId": "s1", "profile": "claude", "message": "hi"}
            )
            await wait_for(lambda: _async(len(stub.turns) >= 1), what="the first model turn")
            steered = await c.child_steer("root-run", ext, gen, child.child_id, "STEER: left")
            assert steered.injected, steered
            done = await wait_for(
                lambda: _done(child_result(child.child_id)), what="the steered child to end"
            )
            assert done.status == "succeeded", done.error
            assert done.output == "heard left"
            kinds = [e.kind for e in done.events]
            assert kinds.count("result") == 2 and kinds.count("usage") == 2, kinds
            costs = [e.input["costUsd"] for e in done.events if e.kind == "usage"]
            assert all(cost > 0 for cost in costs)
            late = await c.child_steer("root-run", ext, gen, child.child_id, "too late")
            assert late.outcome == "promptRequired"

            # A cancel during a turn stops the Claude Code process and everything it started.
            victim = await c.child_start(
                "root-run", ext, gen, {"requestId": "s2", "profile": "claude", "message": "x"}
            )
            before = len(stub.turns)
            await wait_for(lambda: _async(len(stub.turns) > before), what="the victim's turn")
            pid = host.runs[victim.run_id].data["pid"]
            assert pid_alive(pid)
            # Claude Code runs in the sandbox a preset gets by default.
            assert Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"bwrap\0")
            await c.child_cancel("root-run", ext, gen, victim.child_id)
            cancelled = await wait_for(
                lambda: _done(child_result(victim.child_id)), what="the cancel"
            )
            assert cancelled.status == "cancelled"
            await wait_for(lambda: _async(not _group_alive(pid)), what="the process group")
            await c.finish("root-run", output="ok")


async def _async(value):
    return value


async def _done(result_coro):
    result = await result_coro
    return result if result.done else None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_it_points_make_run_at_a_presets_file(tmp_path):
    from delegation.management.commands.demo import runner_command

    opts = {"host": "127.0.0.1", "port": 8123, "presets": "agents.json", "engine": "acp"}
    cmd = runner_command({**opts, "root": ["-fix the parser"], "root_profile": "claude"}, 7)
    assert cmd[cmd.index("--engine") + 1] == "acp"
    assert cmd[cmd.index("--config") + 1] == os.path.abspath("agents.json")
    assert "--root=-fix the parser" in cmd and "--demo" not in cmd
    assert cmd[cmd.index("--root-profile") + 1] == "claude"
    scripted = runner_command({**opts, "presets": None, "interval": 5, "max_live": 6}, 7)
    assert "--demo" in scripted and scripted[scripted.index("--engine") + 1] == "scripted"
    # The Makefile passes the variables through (dry run: nothing is executed).
    made = __import__("subprocess").run(
        ["make", "-n", "run", "PRESETS=agents.json", "ROOT=fix it", "PROFILE=claude"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    joined = made.stdout.replace("\\\n", " ")
    line = next(x for x in joined.splitlines() if "manage.py demo" in x)
    assert "--presets 'agents.json'" in line and "'--root=fix it'" in line
    assert "--root-profile 'claude'" in line

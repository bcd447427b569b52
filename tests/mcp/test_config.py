"""Canopy's MCP server handed to a command-engine agent: the per-child ``{mcpConfig}`` file
(SPEC §9), against a real daphne server and the reference runner host."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import pytest
from asgiref.sync import sync_to_async

from delegation.client import NoSuchRun
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from delegation.services import tokens
from tests.support.paths import AGENTS
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
]

PROBE = [sys.executable, str(AGENTS / "mcp_config_probe.py")]
RUN_TOKEN = "crt_secret-run-token-value"


async def read_until(c, ext, gen, child_id, predicate, timeout=30):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await c.child_read("root-run", ext, gen, child_id)
        if predicate(result):
            return result
        assert loop.time() < deadline, result
        await asyncio.sleep(0.05)


async def test_it_writes_a_private_mcp_config_per_child_and_removes_it_at_the_end(
    daphne_server, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG)
    _runner, token = await sync_to_async(tokens.create_runner)("mcpcfg-runner")
    asked = []

    async def mcp(ctx):
        asked.append(ctx.run_id)
        return {"url": "http://127.0.0.1:8123/mcp", "token": RUN_TOKEN}

    engine = CommandEngine(
        [
            CommandPreset.from_config(
                {
                    "name": "probe",
                    "command": PROBE + ["{mcpConfig}"],
                    "env": {"MCP_PROBE_EXPECT": RUN_TOKEN, "SETTINGS_PATH": "{mcpConfig}"},
                }
            ),
        ],
        str(tmp_path),
        mcp=mcp,
    )
    host = RunnerHost(daphne_server.ws_url, token, engine, extension_id="m", client_options=FAST)
    ext, gen, c = host.extension_id, host.generation, host.client
    async with host:
        await c.open_run("root-conv", "root-run", depth=1)
        child = await c.child_start(
            "root-run", ext, gen, {"requestId": "r1", "profile": "probe", "message": "go"}
        )
        running = await read_until(
            c, ext, gen, child.child_id, lambda r: any(e.kind == "probe" for e in r.events)
        )
        report = next(e for e in running.events if e.kind == "probe").input
        assert asked == [child.run_id]
        assert report["mode"] == "0o600" and report["dirMode"] == "0o700"
        assert report["keys"] == ["mcpServers"]
        assert report["server"] == {
            "type": "http",
            "url": "http://127.0.0.1:8123/mcp",
            "headers": {"X-Pando-Delegation-Depth": "2"},  # the child's level, not the root's
        }
        assert report["tokenMatches"] is True
        assert report["tokenOnArgv"] is False and report["tokenInEnv"] is False
        assert report["settingsEnv"] == report["path"]  # {mcpConfig} in an env value
        assert os.path.exists(report["path"])
        # Printed by the agent itself, the token still reaches no event.
        said = [e.error or e.text for e in running.events if e.kind in ("error", "text")]
        assert said == ["debug: my MCP header is Bearer [run token]"] * 2

        steered = await c.child_steer("root-run", ext, gen, child.child_id, "finish")
        assert steered.injected
        done = await read_until(c, ext, gen, child.child_id, lambda r: r.done)
        assert done.status == "succeeded" and done.output == "probed"
        await host.wait(child.run_id, timeout=10)
        assert not os.path.exists(report["path"])
        assert not os.path.exists(os.path.dirname(report["path"]))
        await c.finish("root-run", output="ok")
    assert RUN_TOKEN not in caplog.text


async def test_it_fails_a_child_whose_server_gives_no_run_token(daphne_server, tmp_path):
    # A server that refuses the token (the run ended meanwhile, or it has no /mcp): the child
    # fails saying so, rather than running an agent with a broken MCP configuration.
    _runner, token = await sync_to_async(tokens.create_runner)("mcpcfg-runner-2")

    async def refused(ctx):
        raise NoSuchRun(-32004, f"run {ctx.run_id!r}: not a running run of this runner")

    engine = CommandEngine(
        [CommandPreset.from_config({"name": "probe", "command": PROBE + ["{mcpConfig}"]})],
        str(tmp_path),
        mcp=refused,
    )
    host = RunnerHost(daphne_server.ws_url, token, engine, extension_id="m", client_options=FAST)
    ext, gen, c = host.extension_id, host.generation, host.client
    async with host:
        await c.open_run("root-conv", "root-run", depth=1)
        child = await c.child_start(
            "root-run", ext, gen, {"requestId": "r1", "profile": "probe", "message": "go"}
        )
        result = await read_until(c, ext, gen, child.child_id, lambda r: r.done)
        assert result.status == "failed"
        assert result.error == (
            "{mcpConfig}: no run token from the server: "
            f"run {child.run_id!r}: not a running run of this runner"
        )
        assert not any(e.kind == "probe" for e in result.events)

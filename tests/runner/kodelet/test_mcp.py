"""The hosted extension's tools are tools of Canopy's ``/mcp`` for the runs that host them
(SPEC §15): an MCP client holding the run's token lists them next to Canopy's own and calls
kodelet-subagent's ``spawn_agent`` / ``wait_agent`` / ``list_agents`` through the server and
the ``extension.tool.call`` command; a run of a preset without extensions does not see them."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Run
from delegation.runner.host import RunnerHost
from delegation.services import tokens
from tests.runner.kodelet.test_subagent import hosting, plan
from tests.support.mcp_tools import mcp_session
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
]


async def test_it_serves_the_hosted_tools_on_mcp_for_the_hosting_run(daphne_server):
    _inner, engine = hosting()
    _runner, token = await sync_to_async(tokens.create_runner)("kodelet-mcp")
    async with RunnerHost(daphne_server.ws_url, token, engine, client_options=FAST) as host:
        boss = await host.open_root(json.dumps([{"sleep": 60}]), profile="boss")
        other = await host.open_root("Plain work" + plan("p", long=True), profile="worker")
        boss_token = await host.client.mcp_token(boss.run_id)
        other_token = await host.client.mcp_token(other.run_id)
        async with mcp_session(other_token.url, other_token.token) as mcp:
            names = {tool.name for tool in (await mcp.list_tools()).tools}
            assert "delegate" in names and "spawn_agent" not in names
        async with mcp_session(boss_token.url, boss_token.token) as mcp:
            # The run starts its extension before its agent: wait for that here.
            for _ in range(100):
                tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
                if "spawn_agent" in tools:
                    break
                await asyncio.sleep(0.1)
            assert {"delegate", "spawn_agent", "wait_agent", "list_agents"} <= set(tools)
            assert "task" in tools["spawn_agent"].input_schema["properties"]
            spawned = await mcp.call_tool(
                "spawn_agent",
                {"name": "helper", "task": "Help out" + plan("h"), "context_mode": "fresh"},
            )
            assert not spawned.is_error, spawned
            agent_id = spawned.structured_content["agent_id"]
            waited = await mcp.call_tool("wait_agent", {"agent_id": agent_id, "timeout_ms": 60000})
            assert not waited.is_error, waited
            assert "Done with Help out" in waited.content[0].text
            listed = await mcp.call_tool("list_agents", {})
            assert [a["name"] for a in listed.structured_content["agents"]] == ["helper"]
        host.cancel(boss.run_id)
        host.cancel(other.run_id)
        await host.wait(boss.run_id, timeout=30)
    children = await sync_to_async(
        lambda: list(Run.objects.filter(parent__run_id=boss.run_id).values_list("depth", "output"))
    )()
    assert children == [(1, "Done with Help out")]

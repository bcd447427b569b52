"""Real Claude Code delegates through Canopy's /mcp: the pinned CLI (``make agents``), driven
by the scripted model endpoint, offline, with Canopy's MCP server in ``--mcp-config`` and a
real run token. Fails (never skips) without the CLI, like the other real-agent tests."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Run, RunVia
from delegation.runner.model_stub import ModelStub, Steps
from delegation.services import tokens
from tests.support.agents.claude_cli import run_claude
from tests.support.mcp_tools import LiveRunner

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

TOOLS = [
    "mcp__canopy__delegate",
    "mcp__canopy__read_child",
    "mcp__canopy__steer_child",
    "mcp__canopy__cancel_child",
    "mcp__canopy__list_profiles",
]


async def test_it_lets_claude_code_delegate_a_child_through_mcp(daphne_server, tmp_path):
    token = await sync_to_async(lambda: tokens.create_runner("claude-host")[1])()
    script = Steps(
        "mcp__canopy__delegate",
        {"profile": "worker", "message": "Count the TODOs in src/", "requestId": "cc-1"},
        preface="I'll hand this to a worker.",
        answer=lambda r: "Delegated: " + r.tool_result_text(r.tool_results[-1]),
    )
    async with LiveRunner(daphne_server, token) as live:
        # The agent's own run sits at level 1, so its child must be recorded at level 2.
        await live.open("agent-run", depth=1)
        issued = await live.run_token("agent-run")
        servers = {
            "canopy": {
                "type": "http",
                "url": issued["url"],
                "headers": {
                    "Authorization": f"Bearer {issued['token']}",
                    "X-Pando-Delegation-Depth": "1",
                },
            }
        }
        with ModelStub(script) as stub:
            run = await asyncio.to_thread(
                run_claude,
                "Delegate counting the TODOs to a worker.",
                model_url=stub.url,
                home=tmp_path / "home",
                mcp_servers=servers,
                allowed_tools=TOOLS,
            )
        assert run.returncode == 0, run.stderr[-2000:]
        child = await sync_to_async(
            lambda: Run.objects.select_related("parent").get(request_id="cc-1")
        )()
        execute = await live.wait_command("child.execute", child.run_id)

    # The child Claude Code's tool call created, one level below its run, dispatched.
    assert (child.parent.run_id, child.depth, child.via) == ("agent-run", 2, RunVia.MCP)
    assert (child.profile, execute["depth"]) == ("worker", 2)
    assert execute["request"]["message"] == "Count the TODOs in src/"
    # The model was offered Canopy's tools and got the child's Result back.
    first, second = stub.turns[:2]
    assert set(TOOLS) <= set(first.tool_names)
    (result,) = second.tool_results
    assert not result.get("is_error")
    received = json.loads(second.tool_result_text(result))
    assert (received["runId"], received["depth"], received["status"]) == (
        child.run_id,
        2,
        "running",
    )
    (tool_use,) = run.content_blocks("assistant", "tool_use")
    assert tool_use["name"] == "mcp__canopy__delegate"
    assert run.result["is_error"] is False
    assert child.run_id in run.result["result"]

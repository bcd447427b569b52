"""``claude-agent-acp`` (Zed's ACP adapter for Claude Code, successor of ``claude-code-acp``)
offline, over stdio.

Groundwork for the ACP issue: the adapter starts without network, speaks ``initialize``,
opens a session with an MCP server over HTTP, and runs a prompt whose tool call goes through
the toy MCP server, all against the scripted model. Needs ``make agents``.
"""

import subprocess

from delegation.runner.model_stub import ModelStub, Steps
from tests.support.agents.acp_client import ACPAgent
from tests.support.agents.claude_cli import claude_bin
from tests.support.agents.toy_mcp import ToyMCP


def test_it_drives_claude_code_through_acp_with_an_mcp_tool_offline(tmp_path):
    script = Steps("mcp__toy__echo", {"text": "via acp"}, answer="acp done")
    with ModelStub(script) as stub, ToyMCP() as toy, ACPAgent(stub.url, tmp_path) as agent:
        init = agent.request(
            "initialize",
            {
                "protocolVersion": 1,
                "clientCapabilities": {
                    "fs": {"readTextFile": False, "writeTextFile": False},
                    "terminal": False,
                },
            },
        )
        assert init["protocolVersion"] == 1
        assert init["agentCapabilities"]["mcpCapabilities"]["http"] is True
        session = agent.request(
            "session/new",
            {
                "cwd": str(agent.cwd),
                "mcpServers": [{"type": "http", "name": "toy", "url": toy.url, "headers": []}],
            },
        )
        answer = agent.request(
            "session/prompt",
            {"sessionId": session["sessionId"], "prompt": [{"type": "text", "text": "echo"}]},
        )

    assert answer["stopReason"] == "end_turn"
    # claude-agent-acp (the successor of claude-code-acp) also reports the turn's usage.
    assert answer["usage"]["inputTokens"] > 0
    assert toy.calls == [("echo", {"text": "via acp"})]
    # ACP asks the client before running a tool that was not pre-approved.
    assert [p["toolCall"]["toolCallId"] for p in agent.permission_requests] == [
        stub.turns[1].tool_uses[0]["id"]
    ]
    (result,) = stub.turns[1].tool_results
    assert "echo: via acp" in stub.turns[1].tool_result_text(result)
    completed = [
        u for u in agent.updates if u["sessionUpdate"] == "tool_call_update" and u.get("status")
    ]
    assert completed[-1]["status"] == "completed"
    text = "".join(
        u["content"].get("text", "")
        for u in agent.updates
        if u["sessionUpdate"] == "agent_message_chunk"
    )
    assert text == "acp done"
    assert stub.unknown == []
    # CLAUDE_CODE_EXECUTABLE makes the adapter run the pinned CLI, not the older one its
    # agent SDK bundles.
    version = subprocess.run(
        [claude_bin(), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    assert stub.turns[0].headers["User-Agent"].startswith(f"claude-cli/{version} ")

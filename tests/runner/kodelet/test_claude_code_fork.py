"""kodelet-subagent's default ``spawn_agent`` (``context_mode: "fork"``) on a real Claude Code
root (the pinned CLI, offline against the scripted model): the extension's
``kodelet.conversation.fork`` becomes a §14 fork, so the background agent is a Canopy child
at depth 1 started with ``--resume <root's session> --fork-session``, and its first model
request holds the root's earlier messages (SPEC §14, §15)."""

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
SECRET = "LEAD-ONLY-WORD-4410"
LEAD_TASK = f"LEAD: remember {SECRET}; have a background agent say it, then report."
CHILD_TASK = "CHILD-FORK: say which word you were given"


def texts(message: dict) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [b.get("text", "") for b in content or [] if b.get("type") == "text"]


def last_prompt(request: ModelRequest) -> str:
    """The last user message with text: the task this conversation is on (a fork's new
    prompt follows its parent's messages)."""
    prompts = [m for m in request.messages if m.get("role") == "user" and any(texts(m))]
    return " ".join(texts(prompts[-1])) if prompts else ""


class Script:
    def __init__(self):
        self.child_first: ModelRequest | None = None

    def __call__(self, request: ModelRequest):
        if not any(name.startswith("mcp__canopy__") for name in request.tool_names):
            return Text("ok")  # the CLI's side requests (titles, summaries)
        if "CHILD-FORK" in last_prompt(request):
            if self.child_first is None:
                self.child_first = request
            word = SECRET if SECRET in repr(request.messages) else "none"
            return Text(f"The word was {word}.")
        done = {use.get("name") for use in request.tool_uses}
        if SPAWN not in done:
            # No context_mode: kodelet-subagent's default, a fork of this conversation.
            return ToolCall(SPAWN, {"name": "forker", "task": CHILD_TASK})
        if WAIT not in done:
            spawned = request.tool_result_text(request.tool_results[-1])
            found = re.search(r'"agent_id":\s*"([^"]+)"', spawned) or re.search(
                r"Spawned agent '[^']+' \(([^)]+)\)", spawned
            )
            if found is None:
                return Text(f"NO AGENT ID IN: {spawned[:500]}")
            return ToolCall(WAIT, {"agent_id": found[1], "timeout_ms": 120000})
        said = request.tool_result_text(request.tool_results[-1])
        return Text(f"The agent said: {said}")


def user_and_assistant(request: ModelRequest) -> list[dict]:
    return [m for m in request.messages if m.get("role") in ("user", "assistant")]


async def test_a_kodelet_subagent_fork_is_a_claude_code_fork_of_the_hosting_run(
    daphne_server, tmp_path
):
    _runner, token = await sync_to_async(tokens.create_runner)("claude-kodelet-fork")
    script = Script()
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
    lead_run = await sync_to_async(Run.objects.get)(run_id=root.run_id)
    children = await sync_to_async(
        lambda: list(Run.objects.filter(parent=lead_run).select_related("session"))
    )()
    assert lead_run.status == "succeeded", lead_run.error
    [forked] = children
    assert forked.status == "succeeded", forked.error
    assert (forked.depth, forked.session.profile, forked.context_mode) == (1, "claude", "fork")
    assert forked.lease_id is not None  # under the lease kodelet-subagent acquired
    # The root's Claude Code session was forked: the child has a session of its own...
    assert lead_run.agent_session_id
    assert forked.agent_session_id and forked.agent_session_id != lead_run.agent_session_id
    # ...and its first model request carries the root's conversation before its own task.
    first = script.child_first
    assert first is not None, "the forked child never asked the model"
    assert SECRET in repr(first.messages), "the fork did not get the root's conversation"
    assert len(user_and_assistant(first)) > 1
    assert forked.output == f"The word was {SECRET}."
    assert f"The word was {SECRET}." in lead_run.output

"""``contextMode: "fork"`` with real Claude Code (SPEC §14), offline: the reference runner's
command engine runs the README's ``claude`` preset on the pinned CLI, in its sandbox, against
the scripted model. The parent delegates twice through Canopy's MCP ``delegate`` tool, once as
a fork and once fresh: the fork child's first model request holds the parent's earlier
messages (it ran with ``--resume <parent session> --fork-session``), the fresh child's does
not; the parent's session id is recorded on its run."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Run
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.model_stub import ModelStub, Text, ToolCall
from tests.support.agents.delegating import AgentTree
from tests.support.real_agents import offline_claude_preset

pytestmark = [
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]

DELEGATE = "mcp__canopy__delegate"
SECRET = "PARENT-ONLY-WORD-7781"


def texts(message) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [b.get("text", "") for b in content or [] if b.get("type") == "text"]


def said(request) -> str:
    """Everything the conversation sent holds, as text (messages, tool inputs, results)."""
    return repr(request.messages)


def turns(request) -> list[dict]:
    """The conversation's user and assistant messages (the CLI adds a system one)."""
    return [m for m in request.messages if m.get("role") in ("user", "assistant")]


class ForkScript:
    """The parent delegates a fork, then a fresh child, then answers; each child answers."""

    def __init__(self):
        self.first_of: dict[str, object] = {}

    def __call__(self, request):
        if DELEGATE not in request.tool_names:
            return Text("ok")  # the CLI's side requests (titles, summaries)
        # The task is the last user message with text (the CLI may add a system one after it).
        prompts = [m for m in request.messages if m.get("role") == "user" and any(texts(m))]
        asked = " ".join(texts(prompts[-1])) if prompts else ""
        for name in ("CHILD-FORK", "CHILD-FRESH"):
            if name in asked:
                self.first_of.setdefault(name, request)
                return Text(f"{name} done")
        calls = [u for u in request.tool_uses if u.get("name") == DELEGATE]
        if len(calls) == 0:
            mode, task = "fork", "CHILD-FORK: say which word you were given"
        elif len(calls) == 1:
            mode, task = "fresh", "CHILD-FRESH: say which word you were given"
        else:
            return Text("parent done")
        arguments = {"profile": "claude", "message": task, "contextMode": mode}
        return ToolCall(DELEGATE, {**arguments, "waitSeconds": 50}, text=f"delegating {mode}")


def children_of(root_id):
    root = Run.objects.get(run_id=root_id)
    return root, {run.context_mode or "fresh": run for run in Run.objects.filter(parent=root)}


async def test_it_forks_a_claude_code_child_from_its_parents_conversation(daphne_server, tmp_path):
    script = ForkScript()
    with ModelStub(script) as stub:
        preset = offline_claude_preset(stub.url, tmp_path / "home")
        engine = CommandEngine([CommandPreset.from_config(preset)], str(tmp_path))
        async with AgentTree(daphne_server, engine, "claude-fork") as tree:
            root = await tree.host.open_root(f"Remember {SECRET}, then delegate.", profile="claude")
            await tree.host.wait(root.run_id, timeout=200)
        parent, children = await sync_to_async(children_of)(root.run_id)

    assert parent.status == "succeeded", parent.error
    assert set(children) == {"fork", "fresh"}
    for child in children.values():
        assert child.status == "succeeded", child.error
    # The parent's Claude Code session, recorded from its init record, is what was forked.
    assert parent.agent_session_id
    forked_session = children["fork"].agent_session_id
    assert forked_session and forked_session != parent.agent_session_id
    fork_first, fresh_first = script.first_of["CHILD-FORK"], script.first_of["CHILD-FRESH"]
    assert SECRET in said(fork_first), "the fork child did not get the parent's conversation"
    assert len(turns(fork_first)) > 1
    assert SECRET not in said(fresh_first)
    assert len(turns(fresh_first)) == 1  # its own task only

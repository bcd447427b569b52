"""``contextMode: "fork"`` with real Codex (SPEC §14), offline on the scripted Responses
endpoint: the reference runner's command engine runs the README's ``codex`` preset, sandboxed.
The parent delegates twice through Canopy's MCP ``delegate`` tool, once as a fork and once
fresh: the fork child (``codex exec … fork <parent thread>``) sends the parent's earlier
conversation in its first request, the fresh child does not; the parent's thread id is
recorded as its agent session."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Run
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.model_stub import Text, ToolCall
from tests.agents.test_codex import codex_preset
from tests.support.agents.delegating import AgentTree
from tests.support.agents.wire_stubs import ResponsesStub

pytestmark = [
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]

DELEGATE = "mcp__canopy__delegate"
SECRET = "PARENT-ONLY-WORD-4417"


def user_texts(request) -> list[str]:
    out = []
    for item in request.body.get("input") or []:
        if isinstance(item, dict) and item.get("role") == "user":
            out += [
                str(p.get("text", "")) for p in item.get("content") or [] if isinstance(p, dict)
            ]
    return out


class ForkScript:
    """The parent delegates a fork, then a fresh child, then answers; each child answers."""

    def __init__(self):
        self.first_of: dict[str, object] = {}

    def __call__(self, request):
        if DELEGATE not in request.tool_names:
            return Text("ok")
        asked = user_texts(request)
        last = asked[-1] if asked else ""
        for name in ("CHILD-FORK", "CHILD-FRESH"):
            if name in last:
                self.first_of.setdefault(name, request)
                return Text(f"{name} done")
        calls = [u for u in request.tool_uses if u.get("name") == DELEGATE]
        if len(calls) == 0:
            mode, task = "fork", "CHILD-FORK: say which word you were given"
        elif len(calls) == 1:
            mode, task = "fresh", "CHILD-FRESH: say which word you were given"
        else:
            return Text("parent done")
        arguments = {"profile": "codex", "message": task, "contextMode": mode, "waitSeconds": 50}
        return ToolCall(DELEGATE, arguments, text=f"delegating {mode}")


def children_of(root_id):
    root = Run.objects.get(run_id=root_id)
    return root, {run.context_mode or "fresh": run for run in Run.objects.filter(parent=root)}


async def test_it_forks_a_codex_child_from_its_parents_thread(daphne_server, tmp_path):
    script = ForkScript()
    with ResponsesStub(script) as stub:
        engine = CommandEngine([CommandPreset.from_config(codex_preset(stub.url))], str(tmp_path))
        async with AgentTree(daphne_server, engine, "codex-fork") as tree:
            root = await tree.host.open_root(f"Remember {SECRET}, then delegate.", profile="codex")
            await tree.host.wait(root.run_id, timeout=200)
        parent, children = await sync_to_async(children_of)(root.run_id)
        assert not stub.script_errors

    assert parent.status == "succeeded", parent.error
    assert set(children) == {"fork", "fresh"}
    for child in children.values():
        assert child.status == "succeeded", child.error
    # The parent's Codex thread, from its thread.started record, is what was forked.
    assert parent.agent_session_id
    forked = children["fork"].agent_session_id
    assert forked and forked != parent.agent_session_id
    fork_first, fresh_first = script.first_of["CHILD-FORK"], script.first_of["CHILD-FRESH"]
    assert SECRET in repr(fork_first.body["input"]), "the fork child lacks the parent's thread"
    assert SECRET not in repr(fresh_first.body["input"])

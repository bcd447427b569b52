"""``contextMode: "fork"`` with real Codex and real Gemini CLI (SPEC §14), offline on their
scripted endpoints: the reference runner's command engine runs the README's preset, sandboxed.
The parent delegates twice through Canopy's MCP ``delegate`` tool, once as a fork and once
fresh: the fork child (Codex: ``codex exec … fork <parent thread>``; Gemini: ``--session-file``
naming a copy of the parent's session) sends the parent's earlier conversation in its first
request, the fresh child does not; each run records its own agent session."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Run
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.model_stub import Text, ToolCall
from tests.agents.test_codex import codex_preset
from tests.agents.test_gemini import gemini_preset
from tests.support.agents.delegating import AgentTree
from tests.support.agents.wire_stubs import GeminiStub, ResponsesStub

pytestmark = [
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]

SECRET = "PARENT-ONLY-WORD-4417"
ENGINES = {
    # profile: (its stub, its preset, its name for Canopy's delegate tool)
    "codex": (ResponsesStub, codex_preset, "mcp__canopy__delegate"),
    "gemini": (GeminiStub, gemini_preset, "mcp_canopy_delegate"),
}


def user_texts(request) -> list[str]:
    """The text of each user message, in order (Responses ``input`` or Gemini ``contents``)."""
    body = request.body
    out = []
    for item in body.get("input") or body.get("contents") or []:
        if isinstance(item, dict) and item.get("role") == "user":
            parts = item.get("content") or item.get("parts") or []
            out += [str(p["text"]) for p in parts if isinstance(p, dict) and p.get("text")]
    return out


class ForkScript:
    """The parent delegates a fork, then a fresh child, then answers; each child answers."""

    def __init__(self, profile: str, delegate: str):
        self.profile, self.delegate = profile, delegate
        self.first_of: dict[str, object] = {}

    def __call__(self, request):
        if self.delegate not in request.tool_names:
            return Text("ok")
        asked = user_texts(request)
        for name in ("CHILD-FORK", "CHILD-FRESH"):
            if asked and name in asked[-1]:
                self.first_of.setdefault(name, request)
                return Text(f"{name} done")
        calls = [u for u in request.tool_uses if u.get("name") == self.delegate]
        if len(calls) == 0:
            mode, task = "fork", "CHILD-FORK: say which word you were given"
        elif len(calls) == 1:
            mode, task = "fresh", "CHILD-FRESH: say which word you were given"
        else:
            return Text("parent done")
        arguments = {"profile": self.profile, "message": task, "contextMode": mode}
        return ToolCall(self.delegate, {**arguments, "waitSeconds": 50}, text=f"delegating {mode}")


def children_of(root_id):
    root = Run.objects.get(run_id=root_id)
    return root, {run.context_mode or "fresh": run for run in Run.objects.filter(parent=root)}


@pytest.mark.parametrize("profile", sorted(ENGINES))
async def test_it_forks_a_child_from_its_parents_session(profile, daphne_server, tmp_path):
    stub_class, make_preset, delegate = ENGINES[profile]
    script = ForkScript(profile, delegate)
    with stub_class(script) as stub:
        preset = CommandPreset.from_config(make_preset(stub.url))
        engine = CommandEngine([preset], str(tmp_path))
        async with AgentTree(daphne_server, engine, f"{profile}-fork") as tree:
            root = await tree.host.open_root(f"Remember {SECRET}, then delegate.", profile=profile)
            await tree.host.wait(root.run_id, timeout=200)
        parent, children = await sync_to_async(children_of)(root.run_id)
        assert not stub.script_errors

    assert parent.status == "succeeded", parent.error
    assert set(children) == {"fork", "fresh"}
    for child in children.values():
        assert child.status == "succeeded", child.error
    # The parent's session, from its first record, is what was forked.
    assert parent.agent_session_id
    forked = children["fork"].agent_session_id
    assert forked and forked != parent.agent_session_id
    fork_first, fresh_first = script.first_of["CHILD-FORK"], script.first_of["CHILD-FRESH"]
    assert SECRET in " ".join(user_texts(fork_first)), "the fork lacks the parent's conversation"
    assert SECRET not in repr(fresh_first.body)

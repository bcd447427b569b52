"""Fan out and join with real Claude Code processes (SPEC §9), offline: the reference runner's
command engine runs the README's ``claude`` preset for the parent and every child, each gets
Canopy's ``/mcp`` through its ``{mcpConfig}``; the parent delegates three children and joins
them with ``await_children`` (``quorum`` 2, then ``all``), each child calls ``conclude``, and the
parent's final result ends with a ``canopy-conclusion`` block. Real daphne, real MCP over HTTP,
real processes; the only stand-in is the model endpoint."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Event, Run
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from delegation.runner.model_stub import ModelStub, Text
from delegation.services import tokens
from tests.support import runners
from tests.support.agents.fan_out import (
    AWAIT,
    CONCLUDE,
    HELD,
    PARENT_CONCLUSION,
    PARENT_TASK,
    FanOutScript,
    child_conclusion,
    spend,
)
from tests.support.real_agents import offline_claude_preset

pytestmark = [
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]

FAST = {**runners.FAST, "call_timeout": 60}
# Three delegate turns, a quorum and an all join, and the final answer.
AWAIT_TURNS = 3 + 2 + 1


class Host:
    """A runner host whose command engine runs the offline ``claude`` preset, and the stub."""

    def __init__(self, server, tmp_path, script):
        self.server, self.tmp_path, self.script = server, tmp_path, script

    async def __aenter__(self):
        _runner, token = await sync_to_async(tokens.create_runner)("claude-fan-out")
        self.stub = ModelStub(self.script).__enter__()
        preset = offline_claude_preset(self.stub.url, self.tmp_path / "home")
        engine = CommandEngine([CommandPreset.from_config(preset)], str(self.tmp_path))
        self.host = RunnerHost(
            self.server.ws_url, token, engine, extension_id="claude", client_options=FAST
        )
        await self.host.start()
        return self

    async def __aexit__(self, *exc):
        released = getattr(self.script, "released", None)
        if released is not None:
            released.set()
        await self.host.stop()
        self.stub.__exit__(None, None, None)


def _tree(root_id: str) -> tuple[Run, list[Run]]:
    root = Run.objects.get(run_id=root_id)
    return root, list(Run.objects.filter(parent=root).order_by("request_id"))


async def _fan_out(server, tmp_path, mode: str):
    """The scripted three-child fan-out, run to its end: (script, model turns, parent, children)."""
    script = FanOutScript(mode)
    async with Host(server, tmp_path, script) as fan:
        root = await fan.host.open_root(PARENT_TASK, profile="claude")
        await fan.host.wait(root.run_id, timeout=200)
        turns = fan.stub.turns
    parent, children = await sync_to_async(_tree)(root.run_id)
    return script, turns, parent, children


def _reported_usage(run: Run) -> dict:
    """What Claude Code itself reported for the run (its usage events): tokens in and out."""
    usage = list(Event.objects.filter(run=run, kind="usage").values_list("input", flat=True))
    return {
        "usageInputTokens": sum(u["inputTokens"] for u in usage),
        "usageOutputTokens": sum(u["outputTokens"] for u in usage),
    }


def _kinds(run: Run) -> list[str]:
    return list(Event.objects.filter(run=run).order_by("sequence").values_list("kind", flat=True))


async def test_it_fans_out_three_claude_code_children_and_joins_them_with_a_quorum_then_all(
    daphne_server, tmp_path
):
    script, turns, parent, children = await _fan_out(daphne_server, tmp_path, "await")
    assert parent.status == "succeeded", parent.error
    assert [c.request_id for c in children] == ["part-0", "part-1", "part-2"]
    for part, child in enumerate(children):
        assert (child.status, child.via, child.depth) == ("succeeded", "mcp", 1), child.error
        assert child.conclusion == {**child_conclusion(part), "artifacts": [], "followUp": []}
        # The child's own stream shows the conclude tool call and the stored conclusion.
        assert "conclusion" in await sync_to_async(_kinds)(child)
    ids = [
        c.session.conversation_id
        for c in await sync_to_async(
            lambda: [Run.objects.select_related("session").get(pk=c.pk) for c in children]
        )()
    ]

    quorum, every = script.joins
    # The quorum came back when the second child finished: parts 0 and 1 done, the held
    # part still running (it is released only once the parent has this answer).
    assert quorum["done"] is True
    assert [r["conversationId"] for r in quorum["results"]] == ids
    assert [r["done"] for r in quorum["results"]] == [True, True, False]
    assert quorum["results"][HELD]["status"] == "running"
    assert quorum["results"][HELD]["conclusion"] is None
    assert [r["conclusion"]["summary"] for r in quorum["results"][:HELD]] == [
        "part 0 done",
        "part 1 done",
    ]
    # ... then all: every child's conclusion is in the parent's tool result.
    assert every["done"] is True
    assert [r["conclusion"]["summary"] for r in every["results"]] == [
        f"part {n} done" for n in range(3)
    ]
    # The parent's final result ended with a canopy-conclusion block: parsed and stored.
    assert parent.conclusion == {**PARENT_CONCLUSION, "artifacts": [], "followUp": []}
    assert parent.output.startswith("All parts joined.")
    kinds = await sync_to_async(_kinds)(parent)
    assert kinds[-2:] == ["result", "conclusion"] or kinds.count("conclusion") == 1, kinds
    # Two join calls, no read_child polling: the parent's model spent one turn per call.
    parent_turns = spend(turns)
    reported = await sync_to_async(_reported_usage)(parent)
    print(f"\nawait_children fan-out, the parent's model: {parent_turns} {reported}")
    assert parent_turns["turns"] == AWAIT_TURNS, parent_turns
    assert sum(1 for t in turns for u in t.tool_uses if u.get("name") == AWAIT) >= 2
    assert any(u.get("name") == CONCLUDE for t in turns for u in t.tool_uses)


async def test_it_keeps_claude_codes_output_and_stores_an_error_for_an_invalid_block(
    daphne_server, tmp_path
):
    output = (
        'Done.\n\n```canopy-conclusion\n{"status": "done", "summary": "ok", "confidence": 3}\n```'
    )

    def script(request):
        return Text(output if request.tool_names else "ok")

    async with Host(daphne_server, tmp_path, script) as host:
        root = await host.host.open_root("answer at once", profile="claude")
        await host.host.wait(root.run_id, timeout=120)
    run = await sync_to_async(Run.objects.get)(run_id=root.run_id)
    assert (run.status, run.output, run.conclusion) == ("succeeded", output, None)
    errors = await sync_to_async(list)(
        Event.objects.filter(run=run, kind="error").values_list("error", "data")
    )
    assert len(errors) == 1, errors
    message, data = errors[0]
    assert "canopy-conclusion.confidence" in message
    assert data == {"field": "canopy-conclusion.confidence", "source": "output"}
    assert (
        json.loads(output.split("```canopy-conclusion\n")[1].split("\n```")[0])["status"] == "done"
    )


async def test_it_spends_more_parent_turns_when_the_same_fan_out_polls_read_child(
    daphne_server, tmp_path
):
    # The same task joined by read_child (each call waits up to 50 s for the child's next
    # event or its end): every answer is a model turn, and each carries events.
    _script, turns, parent, children = await _fan_out(daphne_server, tmp_path, "poll")
    assert parent.status == "succeeded" and len(children) == 3, parent.error
    assert all(c.conclusion is not None for c in children)
    polled = spend(turns)
    reported = await sync_to_async(_reported_usage)(parent)
    print(f"\nread_child fan-out, the parent's model: {polled} {reported}")
    assert polled["turns"] > AWAIT_TURNS, polled

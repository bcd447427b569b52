"""Fork from here (SPEC §14, issue 37) with real Claude Code, offline: the README's ``claude``
preset on the pinned CLI, sandboxed, against the scripted model. A run asks a tool, reads its
result and answers; once it has finished (its sandboxed HOME gone) an operator forks it over
REST at the tool result's step with a new instruction: the fork's first model request holds
the conversation up to that step and the new message, not what the original said after it.
A fork without a step continues from the end. Both runs link to each other in REST."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Event, Run
from delegation.runner.model_stub import Text, ToolCall
from tests.support.real_agents import claude_over_rest

pytestmark = [
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]

TOOL = "mcp__canopy__list_profiles"
FIRST, LATER = "FIRST-WORD-ALPHA-3301", "LATER-WORD-OMEGA-7719"


class Script:
    """The original asks a tool, then answers LATER; each fork's first request is kept."""

    def __init__(self):
        self.first_of: dict[str, object] = {}

    def __call__(self, request):
        if TOOL not in request.tool_names:
            return Text("ok")  # the CLI's side requests (titles, summaries)
        said = repr(request.messages)
        for name in ("FORK-AT-STEP", "FORK-AT-END"):
            if name in repr(request.messages[-1:]):
                self.first_of.setdefault(name, request)
                return Text(f"{name} done")
        if "tool_result" not in said:
            return ToolCall(TOOL, {}, text="listing profiles")
        return Text(f"{LATER}: the profiles are listed")


async def finished(run_id: str, timeout: float = 120.0) -> None:
    """Until the run (launched by the server, not opened by the host) is done."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (await sync_to_async(Run.objects.get)(run_id=run_id)).done:
        assert loop.time() < deadline, f"run {run_id} did not finish"
        await asyncio.sleep(0.2)


def said(request) -> str:
    return repr(request.messages)


async def test_an_operator_forks_a_finished_claude_code_run_from_a_step(
    daphne_server, tmp_path, operator
):
    script = Script()
    read = sync_to_async(lambda run_id: Run.objects.get(run_id=run_id))
    step_of = sync_to_async(
        lambda run_id, kind: Event.objects.get(run__run_id=run_id, kind=kind).sequence
    )
    async with claude_over_rest(
        script,
        server=daphne_server,
        tmp_path=tmp_path,
        operator=operator,
        name="claude-fork-here",
        session_store=str(tmp_path / "kept"),
    ) as (host, http):
        root = await host.open_root(f"Remember {FIRST}, then list the profiles.", profile="claude")
        await host.wait(root.run_id, timeout=120)
        original = await read(root.run_id)
        assert original.status == "succeeded", original.error
        assert LATER in original.output
        step = await step_of(root.run_id, "tool-result")

        answer = await http.post(
            f"/api/runs/{root.run_id}/fork",
            json={"sequence": step, "message": "FORK-AT-STEP: which word came first?"},
        )
        assert answer.status_code == 201, answer.text
        at_step = answer.json()["runId"]
        await finished(at_step)

        answer = await http.post(
            f"/api/runs/{root.run_id}/fork", json={"message": "FORK-AT-END: and then?"}
        )
        assert answer.status_code == 201, answer.text
        at_end = answer.json()["runId"]
        await finished(at_end)

        fork_detail = (await http.get(f"/api/runs/{at_step}")).json()
        original_detail = (await http.get(f"/api/runs/{root.run_id}")).json()

    for run_id in (at_step, at_end):
        run = await read(run_id)
        assert run.status == "succeeded", run.error
        assert run.depth == 0 and run.profile == "claude"
        assert run.agent_session_id not in ("", original.agent_session_id)
    first = script.first_of["FORK-AT-STEP"]
    assert FIRST in said(first), "the fork did not continue the original's conversation"
    assert "tool_result" in said(first)  # up to and including the step
    assert LATER not in said(first), "the fork kept what the original said after the step"
    assert "FORK-AT-STEP" in repr(first.messages[-1:])
    end = script.first_of["FORK-AT-END"]
    assert FIRST in said(end) and LATER in said(end)

    assert fork_detail["forkedFrom"] == {"runId": root.run_id, "sequence": step}
    assert original_detail["forkedFrom"] is None
    assert original_detail["forks"] == [
        {"runId": at_step, "sequence": step},
        {"runId": at_end, "sequence": None},
    ]

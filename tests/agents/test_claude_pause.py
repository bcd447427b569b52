"""Pause and resume of real Claude Code (SPEC §14), offline: the README's ``claude`` preset on
the pinned CLI, sandboxed, against the scripted model. While its model turn is held, an
operator pauses the run over REST: every process of the agent (all but bwrap) is in state T;
the model then answers, and the stopped agent produces no events until it is resumed, after
which it finishes with that answer."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Run
from delegation.runner import process as proc
from delegation.runner.model_stub import Text
from tests.support.agents.delegating import wait_for
from tests.support.real_agents import claude_over_rest

pytestmark = [
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]


class HeldScript:
    """The task's turn waits until released; side requests are answered at once."""

    def __init__(self):
        self.held, self.released = threading.Event(), threading.Event()

    def __call__(self, request):
        if "PAUSE-ME" in repr(request.messages[:1]) and request.tool_names:
            self.held.set()
            self.released.wait(120)
            return Text("finished after the pause")
        return Text("ok")


def state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return "gone"


def agent_states(process) -> set[str]:
    return {state(pid) for pid in proc.members(process.pid) if pid != process.pid}


async def test_it_stops_claude_code_while_paused_and_it_finishes_after_resume(
    daphne_server, tmp_path, operator
):
    script = HeldScript()
    read = sync_to_async(lambda run_id: Run.objects.get(run_id=run_id))
    async with claude_over_rest(
        script, server=daphne_server, tmp_path=tmp_path, operator=operator, name="claude-pause"
    ) as (host, http):
        root = await host.open_root("PAUSE-ME: answer once asked", profile="claude")
        await wait_for(
            lambda: asyncio.to_thread(script.held.is_set), timeout=60, what="the model turn"
        )
        process = root.data["process"]
        answer = await http.post(f"/api/runs/{root.run_id}/pause", json={"reason": "wait"})
        assert answer.json()["outcome"] == "paused", answer.text

        async def stopped():
            states = agent_states(process)
            return states and states == {"T"}

        await wait_for(stopped, timeout=60, what="every Claude Code process in state T")
        held = (await read(root.run_id)).last_sequence
        script.released.set()  # the model answers a stopped agent
        await asyncio.sleep(1.5)
        run = await read(root.run_id)
        assert run.last_sequence == held and run.status == "paused"
        assert agent_states(process) == {"T"}

        answer = await http.post(f"/api/runs/{root.run_id}/resume")
        assert answer.json()["outcome"] == "resumed", answer.text
        await host.wait(root.run_id, timeout=90)
        run = await read(root.run_id)
    assert run.status == "succeeded", run.error
    assert run.output == "finished after the pause"
    assert run.paused_seconds >= 1.5

"""Pause and resume of real Claude Code (SPEC §14), offline: the README's ``claude`` preset on
the pinned CLI, sandboxed, against the scripted model. While its model turn is held, an
operator pauses the run over REST: every process of the agent (all but bwrap) is in state T;
the model then answers, and the stopped agent produces no events until it is resumed, after
which it finishes with that answer."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from asgiref.sync import sync_to_async

from delegation.models import Run
from delegation.runner import process as proc
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from delegation.runner.model_stub import ModelStub, Text
from delegation.services import tokens
from tests.support.personas import api_token
from tests.support.real_agents import offline_claude_preset
from tests.support.runners import FAST

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


async def until(check, timeout=60.0, what=""):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (result := await check()):
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return result


async def test_it_stops_claude_code_while_paused_and_it_finishes_after_resume(
    daphne_server, tmp_path, operator
):
    script = HeldScript()
    _runner, token = await sync_to_async(tokens.create_runner)("claude-pause")
    bearer = await sync_to_async(api_token)(operator)
    read = sync_to_async(lambda run_id: Run.objects.get(run_id=run_id))
    with ModelStub(script) as stub:
        preset = offline_claude_preset(stub.url, tmp_path / "home")
        engine = CommandEngine([CommandPreset.from_config(preset)], str(tmp_path))
        host = RunnerHost(
            daphne_server.ws_url, token, engine, extension_id="cp", client_options=FAST
        )
        headers = {"Authorization": f"Bearer {bearer}"}
        async with (
            host,
            httpx.AsyncClient(base_url=daphne_server.http_url, headers=headers, timeout=30) as http,
        ):
            root = await host.open_root("PAUSE-ME: answer once asked", profile="claude")
            await until(lambda: asyncio.to_thread(script.held.is_set), what="the model turn")
            process = root.data["process"]
            answer = await http.post(f"/api/runs/{root.run_id}/pause", json={"reason": "wait"})
            assert answer.json()["outcome"] == "paused", answer.text

            async def stopped():
                states = agent_states(process)
                return states and states == {"T"}

            await until(stopped, what="every Claude Code process in state T")
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

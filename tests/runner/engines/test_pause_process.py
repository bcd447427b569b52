"""Pause and resume of a real agent process (SPEC §14), end to end: a daphne server, the
reference runner host, the command engine and a python agent that ticks and has a child of
its own. While paused every process of the agent is in state T (in a sandbox: all but bwrap)
and the run gets no events; after the resume it picks up where it stopped and finishes."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest
from asgiref.sync import sync_to_async

from delegation.models import Run
from delegation.runner import process as proc
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from delegation.services import tokens
from tests.support.personas import api_token
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
]

TICKS = 30
# Ticks every 50 ms with a sleeping child of its own (the whole group must stop), then ends.
AGENT = f"""
import subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for i in range({TICKS}):
    print(f"tick {{i}}", flush=True)
    time.sleep(0.05)
helper.kill()
print("finished", flush=True)
"""


async def operator_api(server, operator) -> httpx.AsyncClient:
    """The REST API as an operator: the pause goes through the server, as a person's does."""
    token = await sync_to_async(api_token)(operator)
    return httpx.AsyncClient(
        base_url=server.http_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return "gone"


def agent_states(process) -> dict[int, str]:
    """The state of every process of the agent's group, bwrap itself left out."""
    return {
        pid: state(pid)
        for pid in proc.members(process.pid)
        if pid != process.pid or not process.sandboxed
    }


async def until(check, timeout=15.0, what=""):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (result := await check()):
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return result


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
async def test_it_stops_the_whole_agent_while_paused_and_finishes_after_resume(
    daphne_server, tmp_path, sandbox, operator
):
    _runner, token = await sync_to_async(tokens.create_runner)("pause-runner")
    preset = {"name": "ticker", "command": [sys.executable, "-c", AGENT], "sandbox": sandbox}
    engine = CommandEngine([CommandPreset.from_config(preset)], str(tmp_path))
    host = RunnerHost(daphne_server.ws_url, token, engine, extension_id="px", client_options=FAST)
    ext, gen, c = host.extension_id, host.generation, host.client
    read = sync_to_async(lambda run_id: Run.objects.get(run_id=run_id))

    async with host, await operator_api(daphne_server, operator) as http:
        await c.open_run("root-conv", "root-run")
        child = await c.child_start(
            "root-run", ext, gen, {"requestId": "p1", "profile": "ticker", "message": "go"}
        )
        run_id = child.run_id

        async def ticking():
            result = await c.child_read("root-run", ext, gen, child.child_id)
            return sum(e.kind == "text" for e in result.events) >= 3

        await until(ticking, what="the first ticks")
        process = host.runs[run_id].data["process"]
        await until(lambda: _true(len(agent_states(process)) >= 2), what="the agent's helper")

        answer = await http.post(f"/api/runs/{run_id}/pause", json={"reason": "hold on"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["outcome"] == "paused"
        assert (await read(run_id)).status == "paused"

        async def all_stopped():
            states = agent_states(process)
            return states and set(states.values()) == {"T"}

        await until(all_stopped, what="every agent process in state T")
        if sandbox == "bwrap":
            assert state(process.pid) != "T"  # bwrap itself keeps running (it reaps)
        held = (await read(run_id)).last_sequence
        await asyncio.sleep(1.0)  # 20 ticks' worth of time
        assert (await read(run_id)).last_sequence == held, "a paused agent produced events"
        assert set(agent_states(process).values()) == {"T"}
        assert not host.runs[run_id].finished

        answer = await http.post(f"/api/runs/{run_id}/resume")
        assert answer.json()["outcome"] == "resumed", answer.text

        async def done():
            run = await read(run_id)
            return run if run.done else None

        finished = await until(done, what="the run to finish after the resume")
        assert finished.status == "succeeded", finished.error
        assert finished.paused_seconds >= 1.0
        result = await c.child_read("root-run", ext, gen, child.child_id)
        texts = [e.text for e in result.events if e.kind == "text"]
        assert texts == [f"tick {i}" for i in range(TICKS)] + ["finished"]
        kinds = [e.kind for e in result.events]
        assert kinds.index("paused") < kinds.index("resumed")
        await c.finish("root-run", output="ok")


async def _true(value):
    return value


async def test_it_cancels_a_paused_agent(daphne_server, tmp_path, operator):
    _runner, token = await sync_to_async(tokens.create_runner)("pause-cancel-runner")
    preset = {"name": "ticker", "command": [sys.executable, "-c", AGENT], "sandbox": "none"}
    engine = CommandEngine([CommandPreset.from_config(preset)], str(tmp_path))
    host = RunnerHost(daphne_server.ws_url, token, engine, extension_id="pc", client_options=FAST)
    ext, gen, c = host.extension_id, host.generation, host.client
    read = sync_to_async(lambda run_id: Run.objects.get(run_id=run_id))
    async with host, await operator_api(daphne_server, operator) as http:
        await c.open_run("root-conv", "root-run")
        child = await c.child_start(
            "root-run", ext, gen, {"requestId": "p2", "profile": "ticker", "message": "go"}
        )
        await until(lambda: _true(child.run_id in host.runs), what="the child to start")
        await until(
            lambda: _true("process" in host.runs[child.run_id].data), what="the agent process"
        )
        answer = await http.post(f"/api/runs/{child.run_id}/pause")
        assert answer.json()["outcome"] == "paused", answer.text
        await until(lambda: _true(host.runs[child.run_id].paused), what="run.pause")
        await c.child_cancel("root-run", ext, gen, child.child_id)

        async def done():
            run = await read(child.run_id)
            return run if run.done else None

        finished = await until(done, timeout=10, what="the paused run to end cancelled")
        assert finished.status == "cancelled" and finished.paused_at is None
        await c.finish("root-run", output="ok")

"""The SDK fails over: given several servers, a ``RunnerClient`` whose server dies is back on
another one at once (not after the dead one restarts), registered with the same
``hostInstanceId``, so its runs go on there (issue 20, item 3). Two real daphne processes on
one database; one is killed with SIGKILL."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from canopy.serving import free_port
from delegation.client import Extension, Preset, RunnerClient, event, server_urls
from delegation.models import Event, Run, Runner
from delegation.services import tokens

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

EXTENSION = Extension("ext", 1, [Preset("worker")])
BASE_DIR = Path(__file__).resolve().parents[3]


def _client(urls, token: str) -> RunnerClient:
    return RunnerClient(urls, token, extensions=[EXTENSION], host_instance_id="host-1", depth=None)


async def _registered_again(client: RunnerClient, count: int, timeout: float = 30) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    while client.connections < count or not client.connected:
        assert loop.time() - started < timeout, f"not registered again within {timeout} s"
        await asyncio.sleep(0.01)
    return loop.time() - started


def _stored(run_id: str):
    run = Run.objects.get(run_id=run_id)
    texts = list(Event.objects.filter(run=run).order_by("sequence").values_list("text", flat=True))
    runner = Runner.objects.get(pk=run.runner_id)
    return run.status, texts, runner.host_instance_id, runner.connection_generation


async def test_it_fails_over_to_the_other_server_and_its_run_goes_on(daphne_factory):
    first, second = daphne_factory(), daphne_factory()
    token = (await sync_to_async(tokens.create_runner)("failover-runner"))[1]
    client = _client([first.ws_url, second.ws_url], token)
    try:
        await client.connect()
        assert client.url == first.ws_url
        await client.open_run("conv-1", "run-1", extension_id="ext")
        await client.emit("run-1", event("text", text="before"))

        await asyncio.to_thread(first.stop, kill=True)
        seconds = await _registered_again(client, 2)
        print(f"failover: registered on the other server {seconds:.2f} s after the kill")
        assert client.url == second.ws_url
        await client.emit("run-1", event("text", text="after"))
    finally:
        await client.close()
    status, texts, host, generation = await sync_to_async(_stored)("run-1")
    # The same host instance: the run was not abandoned as lost, and its stream is one.
    assert (status, host, generation) == ("running", "host-1", 2)
    assert [t for t in texts if t in ("before", "after")] == ["before", "after"]
    assert not first.running


async def test_it_skips_a_server_that_is_down_when_it_starts(daphne_factory):
    live = daphne_factory()
    token = (await sync_to_async(tokens.create_runner)("failover-runner"))[1]
    dead = f"ws://127.0.0.1:{free_port()}/ws/runner/"
    # One string with commas, as CANOPY_URL holds several servers.
    client = _client(f"{dead}, {live.ws_url}", token)
    try:
        registration = await client.connect(timeout=20)
    finally:
        await client.close()
    assert client.urls == [dead, live.ws_url] == server_urls([f"{dead},{live.ws_url}"])
    assert registration.runner_id == "failover-runner"
    assert client.url == live.ws_url


def _runner_state(name: str):
    runner = Runner.objects.filter(name=name).first()
    if runner is None:
        return None
    statuses = list(Run.objects.filter(runner=runner).values_list("status", flat=True))
    return runner.connection_generation, runner.host_instance_id, statuses


async def test_it_fails_over_the_reference_runner_given_two_urls(daphne_factory):
    """The runner's command line takes ``--url`` twice; killed mid-tree, its server's work
    goes on on the other one and the tree still finishes."""
    first, second = daphne_factory(), daphne_factory()
    token = (await sync_to_async(tokens.create_runner)("cli-failover"))[1]
    env = {**os.environ, "CANOPY_RUNNER_TOKEN": token}
    env.pop("PANDO_DELEGATION_DEPTH", None)
    env.pop("CANOPY_URL", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "delegation.runner",
        *("--url", first.ws_url, "--url", second.ws_url),
        *("--engine", "scripted", "--max-depth", "1", "--fanout", "1"),
        *("--pace", "0.2", "--steps", "3", "--root", "failover task", "--once"),
        *("--host-instance-id", "cli-host"),
        cwd=BASE_DIR,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:  # the tree has started on the first server
            state = await sync_to_async(_runner_state)("cli-failover")
            if state is not None and state[2]:
                break
            assert loop.time() < deadline and process.returncode is None, "runner never started"
            await asyncio.sleep(0.05)
        await asyncio.to_thread(first.stop, kill=True)
        output, _ = await asyncio.wait_for(process.communicate(), 90)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, output.decode(errors="replace")
    generation, host, statuses = await sync_to_async(_runner_state)("cli-failover")
    assert (generation, host) == (2, "cli-host")
    assert statuses and set(statuses) == {"succeeded"}, statuses

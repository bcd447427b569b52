"""Launch (SPEC §9): an operator starts a top-level run on a connected runner, through the
REST API, ``manage.py launch`` and the reference runner's handling of ``run.execute``."""

from __future__ import annotations

import asyncio
import io
import json

import httpx2
import pytest
from asgiref.sync import sync_to_async
from django.core.management import CommandError, call_command

from delegation.models import AuditEntry, Budget, Command, Run, RunVia
from delegation.runner.host import RunnerHost
from delegation.runner.scripted import ScriptedConfig, ScriptedEngine
from delegation.services import tokens
from tests.support.mcp_tools import LiveRunner
from tests.support.personas import api_token
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.usefixtures("close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


@pytest.fixture
def server(daphne_factory):
    # Commands queued by this test process (manage.py launch) reach the server's socket by
    # its outbox poll, not a doorbell: the in-memory channel layer is per process.
    return daphne_factory(OUTBOX_RESEND_SECONDS="0.2")


@pytest.fixture
def runner_token(transactional_db):
    return tokens.create_runner("launch-runner")[1]


async def _post(server, token: str, body: dict) -> httpx2.Response:
    async with httpx2.AsyncClient(base_url=server.http_url, timeout=10) as http:
        return await http.post("/api/runs", json=body, headers={"Authorization": f"Bearer {token}"})


async def test_it_launches_a_run_at_depth_zero_and_sends_run_execute(
    server, runner_token, operator
):
    token = await sync_to_async(api_token)(operator)
    async with LiveRunner(server, runner_token) as live:
        response = await _post(
            server,
            token,
            {"runner": "launch-runner", "profile": "worker", "message": "build it"},
        )
        assert response.status_code == 201, response.text
        result = response.json()
        execute = await live.wait_command("run.execute", result["runId"])
    assert (result["depth"], result["status"], result["parentRunId"]) == (0, "running", "")
    assert (result["extensionId"], result["profile"], result["events"]) == ("ext", "worker", [])
    assert execute["depth"] == 0 and execute["request"]["message"] == "build it"
    assert execute["preset"] == {"name": "worker", "systemPrompt": "You work."}
    assert execute["identity"]["conversationId"] == result["conversationId"]
    run = await sync_to_async(Run.objects.get)(run_id=result["runId"])
    assert (run.via, run.depth, run.parent_id) == (RunVia.LAUNCH, 0, None)
    entry = await sync_to_async(AuditEntry.objects.get)(action="launch", target_id=run.run_id)
    assert (entry.actor, entry.via, entry.outcome) == (
        f"user:{operator.username}",
        "api",
        "launched",
    )


async def test_it_refuses_a_runner_offline_or_without_the_preset_with_409(
    server, runner_token, operator, viewer
):
    token = await sync_to_async(api_token)(operator)
    offline = await _post(
        server, token, {"runner": "launch-runner", "profile": "worker", "message": "x"}
    )
    assert offline.status_code == 409
    assert "not connected" in offline.json()["error"]["message"]
    async with LiveRunner(server, runner_token):
        missing = await _post(
            server, token, {"runner": "launch-runner", "profile": "nope", "message": "x"}
        )
        unknown = await _post(
            server, token, {"runner": "ghost", "profile": "worker", "message": "x"}
        )
        blank = await _post(
            server, token, {"runner": "launch-runner", "profile": "worker", "message": " "}
        )
        extra = await _post(
            server,
            token,
            {"runner": "launch-runner", "profile": "worker", "message": "x", "budget": 5},
        )
        as_viewer = await _post(
            server,
            await sync_to_async(api_token)(viewer),
            {"runner": "launch-runner", "profile": "worker", "message": "x"},
        )
    assert missing.status_code == 409 and "no preset 'nope'" in missing.json()["error"]["message"]
    assert unknown.status_code == 409 and "ghost" in unknown.json()["error"]["message"]
    assert blank.status_code == 422 and "message" in blank.json()["error"]["message"]
    assert extra.status_code == 422 and "budget" in extra.json()["error"]["message"]
    assert as_viewer.status_code == 403
    assert await sync_to_async(Run.objects.count)() == 0
    assert await sync_to_async(Command.objects.filter(method="run.execute").count)() == 0
    outcomes = await sync_to_async(list)(
        AuditEntry.objects.filter(action="launch").values_list("outcome", flat=True)
    )
    # Offline, no preset, unknown runner, viewer; malformed bodies never reach the service.
    assert len(outcomes) == 4 and all(o.startswith("refused") for o in outcomes)


async def test_it_launches_from_the_command_line(server, runner_token):
    async with LiveRunner(server, runner_token) as live:
        out = io.StringIO()
        await sync_to_async(call_command)(
            "launch", "launch-runner", "reviewer", "review PR 12", stdout=out
        )
        result = json.loads(out.getvalue())
        await live.wait_command("run.execute", result["runId"])
        with pytest.raises(CommandError, match="no preset 'ghost'"):
            await sync_to_async(call_command)("launch", "launch-runner", "ghost", "x")
    assert result["profile"] == "reviewer" and result["depth"] == 0


async def test_it_runs_a_launched_run_on_the_reference_runner(server, runner_token, operator):
    token = await sync_to_async(api_token)(operator)
    engine = ScriptedEngine(ScriptedConfig(pace=0.01, steps=1, fanout=1, depth=1))
    async with RunnerHost(server.ws_url, runner_token, engine, client_options=FAST):
        response = await _post(
            server,
            token,
            {"runner": "launch-runner", "profile": "planner", "message": "plan the release"},
        )
        assert response.status_code == 201, response.text
        run_id = response.json()["runId"]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while loop.time() < deadline:
            run = await sync_to_async(Run.objects.get)(run_id=run_id)
            if run.done:
                break
            await asyncio.sleep(0.1)
    children = await sync_to_async(list)(
        Run.objects.filter(parent=run).values_list("depth", flat=True)
    )
    assert run.status == "succeeded", (run.status, run.error)
    assert children == [1]


async def test_it_launches_a_tree_under_a_budget(server, runner_token, operator):
    token = await sync_to_async(api_token)(operator)
    limits = {"maxRuns": 3, "maxCostUsd": 0.25}
    async with LiveRunner(server, runner_token) as live:
        response = await _post(
            server,
            token,
            {"runner": "launch-runner", "profile": "worker", "message": "go", "budget": limits},
        )
        assert response.status_code == 201, response.text
        run_id = response.json()["runId"]
        await live.wait_command("run.execute", run_id)
        async with httpx2.AsyncClient(base_url=server.http_url, timeout=10) as http:
            detail = await http.get(
                f"/api/runs/{run_id}", headers={"Authorization": f"Bearer {token}"}
            )
    assert detail.status_code == 200, detail.text
    shown = detail.json()["budget"]["limits"]
    assert {name: limit["limit"] for name, limit in shown.items()} == limits
    # The launched run carries rollups like any other, so the budget can be enforced.
    assert detail.json()["usage"]["subtree"]["runs"]["running"] == 1
    budget = await sync_to_async(Budget.objects.get)(run__run_id=run_id)
    assert budget.set_by == f"user:{operator.username}"
    entry = await sync_to_async(AuditEntry.objects.get)(action="launch", target_id=run_id)
    assert entry.detail["budget"] == limits


async def test_it_launches_under_a_budget_from_the_command_line(server, runner_token):
    async with LiveRunner(server, runner_token) as live:
        out = io.StringIO()
        await sync_to_async(call_command)(
            "launch", "launch-runner", "worker", "go", "--budget", '{"maxRuns": 2}', stdout=out
        )
        run_id = json.loads(out.getvalue())["runId"]
        await live.wait_command("run.execute", run_id)
        with pytest.raises(CommandError, match="maxRuns"):
            await sync_to_async(call_command)(
                "launch", "launch-runner", "worker", "go", "--budget", '{"maxRuns": -1}'
            )
    budget = await sync_to_async(Budget.objects.get)(run__run_id=run_id)
    assert budget.max_runs == 2

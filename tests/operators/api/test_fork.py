"""Fork from here (SPEC §14) over REST and ``manage.py launch --fork-from``: one service checks
the role, the run, its preset and the step, audits, and sends the runner ``run.execute`` with
``forkFrom`` (the real Claude Code fork is tests/agents/test_claude_fork_from_here.py)."""

from __future__ import annotations

import asyncio
import io
import json

import httpx2
import pytest
from asgiref.sync import sync_to_async
from django.core.management import CommandError, call_command

from delegation.client import Extension, Preset, RunnerClient
from delegation.models import AuditEntry, Run
from delegation.services import tokens
from tests.support.personas import api_token

pytestmark = [
    pytest.mark.usefixtures("close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

EXTENSION = Extension("ext", 1, [Preset("claude", can_fork=True), Preset("worker")])


@pytest.fixture
def server(daphne_factory):
    # manage.py's commands reach the socket by the outbox poll (the channel layer is per process).
    return daphne_factory(OUTBOX_RESEND_SECONDS="0.2")


class Runner:
    def __init__(self, server, token):
        self.executed: list[dict] = []
        self.client = RunnerClient(server.ws_url, token, extensions=[EXTENSION], depth=None)

        async def execute(params, client):
            self.executed.append(dict(params))
            return {}

        self.client.on("run.execute", execute)

    async def finished_run(self, run_id: str, profile: str = "claude", session: str = "s-1"):
        """A run whose agent reported a session and said three things, then finished."""
        await self.client.open_run(f"conv-{run_id}", run_id, extension_id="ext", profile=profile)
        events = [{"kind": "text", "text": "one"}, {"kind": "text", "text": "two"}]
        if session:
            events.insert(0, {"kind": "session", "input": {"sessionId": session}})
        await self.client.emit(run_id, *events)
        await self.client.finish(run_id, output="two")

    async def wait_execute(self, run_id: str) -> dict:
        for _ in range(500):
            for params in self.executed:
                if params["identity"]["runId"] == run_id:
                    return params
            await asyncio.sleep(0.02)
        raise AssertionError(f"no run.execute for {run_id}")


async def fork(server, bearer: str, run_id: str, body: dict) -> httpx2.Response:
    async with httpx2.AsyncClient(base_url=server.http_url, timeout=10) as http:
        return await http.post(
            f"/api/runs/{run_id}/fork", json=body, headers={"Authorization": f"Bearer {bearer}"}
        )


async def test_it_forks_a_finished_run_at_a_step_over_rest_and_the_command_line(server, operator):
    _r, token = await sync_to_async(tokens.create_runner)("fork-runner")
    bearer = await sync_to_async(api_token)(operator)
    runner = Runner(server, token)
    async with runner.client:
        await runner.finished_run("orig-1")
        answer = await fork(server, bearer, "orig-1", {"sequence": 2, "message": "go on"})
        assert answer.status_code == 201, answer.text
        forked = answer.json()["runId"]
        execute = await runner.wait_execute(forked)

        out = io.StringIO()
        await sync_to_async(call_command)(
            "launch", "--fork-from", "orig-1", "--message", "from the end", stdout=out
        )
        at_end = json.loads(out.getvalue())["runId"]
        end_execute = await runner.wait_execute(at_end)
        with pytest.raises(CommandError, match="no event sequence"):
            await sync_to_async(call_command)("launch", "--fork-from", "orig-1:x", "--message", "m")

    # Step 2 is the agent's first text, the second event the runner emitted.
    assert execute["forkFrom"] == {
        "runId": "orig-1",
        "sessionId": "s-1",
        "sequence": 2,
        "runnerIndex": 2,
    }
    assert execute["request"]["message"] == "go on" and execute["preset"]["name"] == "claude"
    assert end_execute["forkFrom"]["sequence"] is None
    assert end_execute["forkFrom"]["runnerIndex"] is None
    run = await sync_to_async(Run.objects.select_related("forked_from").get)(run_id=forked)
    assert (run.forked_from.run_id, run.forked_from_sequence, run.depth) == ("orig-1", 2, 0)
    assert run.relaunched_from_id is None
    entry = await sync_to_async(AuditEntry.objects.get)(action="launch", target_id=forked)
    assert entry.detail["forkedFrom"]["runId"] == "orig-1"


async def test_it_refuses_what_cannot_be_forked_and_audits_it(server, operator, viewer):
    _r, token = await sync_to_async(tokens.create_runner)("fork-runner")
    bearer = await sync_to_async(api_token)(operator)
    runner = Runner(server, token)
    async with runner.client:
        await runner.finished_run("plain-1", profile="worker")
        await runner.finished_run("quiet-1", session="")
        await runner.finished_run("orig-1")
        await runner.client.open_run("conv-live", "live-1", extension_id="ext", profile="claude")

        cannot = await fork(server, bearer, "plain-1", {"message": "m"})
        assert cannot.status_code == 409 and cannot.json()["error"]["rpcCode"] == -32012
        assert "preset worker cannot fork" in cannot.text
        live = await fork(server, bearer, "live-1", {"message": "m"})
        assert live.status_code == 409 and "fork a finished run" in live.text
        quiet = await fork(server, bearer, "quiet-1", {"message": "m"})
        assert quiet.status_code == 409 and "no agent session" in quiet.text
        beyond = await fork(server, bearer, "orig-1", {"sequence": 99, "message": "m"})
        assert beyond.status_code == 409 and "not 99" in beyond.text
        blank = await fork(server, bearer, "orig-1", {"message": "  "})
        assert blank.status_code == 422
        viewer_bearer = await sync_to_async(api_token)(viewer)
        refused = await fork(server, viewer_bearer, "orig-1", {"message": "m"})
        assert refused.status_code == 403
    assert runner.executed == []
    outcomes = await sync_to_async(
        lambda: sorted(AuditEntry.objects.filter(action="fork").values_list("outcome", flat=True))
    )()
    assert len(outcomes) == 5 and all(o.startswith("refused") for o in outcomes)

"""Commands a call queues go out on the caller's own socket right after its answer (issue 20):
not on the doorbell, not on the 5 s poll, and never as a second answer to the call."""

from __future__ import annotations

import pytest
from django.db import InterfaceError

from delegation.runner_socket.consumer import RunnerSocketConsumer
from delegation.services import outbox

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def no_doorbell_no_poll(settings, monkeypatch):
    """Redis down, as it were: the outbox doorbell is lost and the poll is a minute away."""
    settings.OUTBOX_RESEND_SECONDS = 60

    async def lost(self, message):
        return None

    monkeypatch.setattr(RunnerSocketConsumer, "outbox_ring", lost)


def _lose_the_first_claim(monkeypatch) -> list:
    """The first claim meets a connection a terminated backend closed."""
    claim = outbox.claim_commands
    failures = []

    def lost_once(conn, *args, **kwargs):
        if not failures:
            failures.append(conn.runner_pk)
            raise InterfaceError("connection already closed")
        return claim(conn, *args, **kwargs)

    monkeypatch.setattr(outbox, "claim_commands", lost_once)
    return failures


def _null_id_errors(runner, frames) -> list:
    seen = list(runner.stash.get("__null__", []))
    return seen + [f for f in frames if isinstance(f, dict) and "error" in f and f["id"] is None]


async def test_it_pushes_a_budget_stops_cancel_on_the_socket_whose_usage_crossed_it(
    make_client, runner_token, no_doorbell_no_poll
):
    runner = await make_client(runner_token)
    await runner.open("root-1", budget={"maxTokens": 100})
    usage = {"kind": "usage", "input": {"inputTokens": 90, "outputTokens": 30}}
    answer = await runner.ok("run.event", {"runId": "root-1", "from": 1, "events": [usage]})
    assert answer["emitted"] == 1
    cancel = await runner.wait_command("run.cancel", timeout=3)
    assert cancel["params"]["runId"] == "root-1"
    assert cancel["params"]["reason"].startswith("budget exceeded: maxTokens")


async def test_it_pushes_a_childs_execute_at_once_without_a_doorbell(runner, no_doorbell_no_poll):
    await runner.open("root-1")
    child = await runner.ok("child.start", runner.child_params())
    execute = await runner.wait_command("child.execute", timeout=3)
    assert execute["params"]["identity"]["runId"] == child["runId"]


async def test_it_never_answers_an_answered_call_again_when_its_claim_loses_the_database(
    runner, no_doorbell_no_poll, monkeypatch
):
    await runner.open("root-1")
    failures = _lose_the_first_claim(monkeypatch)
    answer = await runner.call("child.start", runner.child_params())
    frames = await runner.quiet(0.5)
    assert failures and "result" in answer, answer
    assert _null_id_errors(runner, frames) == []


@pytest.mark.postgres
async def test_it_claims_again_on_a_fresh_connection_and_sends_the_command_at_once(
    runner, no_doorbell_no_poll, monkeypatch
):
    await runner.open("root-1")
    failures = _lose_the_first_claim(monkeypatch)
    child = await runner.ok("child.start", runner.child_params())
    execute = await runner.wait_command("child.execute", timeout=3)
    assert failures and execute["params"]["identity"]["runId"] == child["runId"]

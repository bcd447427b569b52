"""``run.mcpToken`` on the runner socket (SPEC §9): a run token for a running run of the caller,
shown once and stored hashed; refusals name what was wrong."""

from __future__ import annotations

import hashlib

import pytest

from delegation.models import RunToken
from tests.support.rpc import adb

pytestmark = pytest.mark.django_db(transaction=True)


async def test_it_issues_a_token_for_a_running_run_stored_only_as_a_hash(runner, settings):
    settings.CANOPY_PUBLIC_URL = "https://canopy.example.com"
    await runner.open("root-1")
    issued = await runner.ok("run.mcpToken", {"runId": "root-1"})
    assert set(issued) == {"url", "token", "expiresAt"}
    assert issued["url"] == "https://canopy.example.com/mcp"
    stored = await adb(lambda: list(RunToken.objects.values_list("token_hash", "token_prefix")))()
    assert stored == [(hashlib.sha256(issued["token"].encode()).hexdigest(), issued["token"][:12])]
    again = await runner.ok("run.mcpToken", {"runId": "root-1"})
    assert again["token"] != issued["token"]


async def test_it_refuses_a_finished_unknown_or_malformed_run(runner, make_client):
    await runner.open("root-1")
    await runner.finish("root-1", output="done")
    finished = await runner.error("run.mcpToken", {"runId": "root-1"})
    unknown = await runner.error("run.mcpToken", {"runId": "nope"})
    extra = await runner.error("run.mcpToken", {"runId": "root-1", "ttl": 5})
    missing = await runner.error("run.mcpToken", {})
    assert (finished["code"], unknown["code"]) == (-32014, -32004)
    assert "root-1" in finished["message"] and "nope" in unknown["message"]
    assert extra["code"] == -32602 and "ttl" in extra["message"]
    assert missing["code"] == -32602 and "runId" in missing["message"]
    assert await adb(RunToken.objects.count)() == 0


async def test_it_refuses_another_runners_run(runner, make_client):
    from tests.support.rpc import create_runner_async

    await runner.open("root-1")
    other = await make_client(await create_runner_async("runner-b"))
    refused = await other.error("run.mcpToken", {"runId": "root-1"})
    assert refused["code"] == -32004

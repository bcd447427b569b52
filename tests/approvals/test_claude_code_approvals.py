"""Real Claude Code asks Canopy before it runs a Bash command that writes a file (SPEC §11):
the pinned CLI, offline against the scripted model, with ``--permission-prompt-tool
mcp__canopy__approve``. The approval waits pending in REST until an operator decides; a
policy rule decides without anyone. Fails (never skips) without the CLI."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from asgiref.sync import sync_to_async

from delegation.models import Event
from delegation.runner.model_stub import ModelStub, Steps
from delegation.services import tokens
from tests.support.agents.claude_cli import run_claude
from tests.support.mcp_tools import LiveRunner

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

PROMPT_TOOL = ["--permission-prompt-tool", "mcp__canopy__approve"]
# The CLI's own per-call timeout must outlast a person's decision (milliseconds).
CLI_ENV = {"MCP_TOOL_TIMEOUT": "120000"}


def _script(target) -> Steps:
    return Steps(
        "Bash",
        {"command": f"touch {target}", "description": "Create the marker file"},
        preface="I'll create the file.",
        answer=lambda r: "Tool said: " + r.tool_result_text(r.tool_results[-1]),
    )


async def _agent(server, token, run_id, tmp_path, target):
    """Open ``run_id``, start Claude Code on it; answers (live runner, claude task, stub)."""
    live = await LiveRunner(server, token).__aenter__()
    await live.open(run_id)
    issued = await live.run_token(run_id)
    servers = {
        "canopy": {
            "type": "http",
            "url": issued["url"],
            "headers": {"Authorization": f"Bearer {issued['token']}"},
        }
    }
    stub = ModelStub(_script(target)).__enter__()
    claude = asyncio.ensure_future(
        asyncio.to_thread(
            run_claude,
            f"Create the file {target}.",
            model_url=stub.url,
            home=tmp_path / run_id,
            mcp_servers=servers,
            extra_args=PROMPT_TOOL,
            env=CLI_ENV,
            timeout=150,
        )
    )
    return live, claude, stub


async def _pending(http, run_id: str, claude) -> dict:
    for _ in range(600):
        page = (
            await http.get("/api/approvals", params={"status": "pending", "run": run_id})
        ).json()
        if page["items"]:
            return page["items"][0]
        assert not claude.done(), "Claude Code ended without asking"
        await asyncio.sleep(0.1)
    raise AssertionError("no pending approval")


def _kinds(run_id: str) -> list[str]:
    return list(
        Event.objects.filter(run__run_id=run_id).order_by("sequence").values_list("kind", flat=True)
    )


async def test_it_runs_the_command_once_an_operator_allows_it_and_not_after_a_deny(
    daphne_server, tmp_path, operator_token
):
    token = await sync_to_async(lambda: tokens.create_runner("claude-host")[1])()
    auth = {"Authorization": f"Bearer {operator_token}"}
    async with httpx.AsyncClient(base_url=daphne_server.http_url, headers=auth, timeout=30) as http:
        # Allowed: the approval is pending in REST with the command; the operator allows.
        allowed = tmp_path / "allowed.txt"
        live, claude, stub = await _agent(daphne_server, token, "cc-allow", tmp_path, allowed)
        try:
            pending = await _pending(http, "cc-allow", claude)
            assert (pending["toolName"], pending["status"]) == ("Bash", "pending")
            assert pending["input"]["command"] == f"touch {allowed}"
            assert not allowed.exists()
            url = f"/api/approvals/{pending['approvalId']}/decision"
            decided = await http.post(url, json={"decision": "allow"})
            assert decided.status_code == 200, decided.text
            again = await http.post(url, json={"decision": "deny"})
            assert again.status_code == 409 and "allow by operator:" in again.text
            run = await claude
        finally:
            stub.__exit__(None, None, None)
            await live.__aexit__(None, None, None)
        assert run.returncode == 0, run.stderr[-2000:]
        assert allowed.exists()
        (result,) = stub.turns[-1].tool_results
        assert not result.get("is_error"), result
        kinds = await sync_to_async(_kinds)("cc-allow")
        assert kinds == ["approval-requested", "approval-decided"]

        # Denied with a message: no file, and the model read the message.
        denied = tmp_path / "denied.txt"
        live, claude, stub = await _agent(daphne_server, token, "cc-deny", tmp_path, denied)
        try:
            pending = await _pending(http, "cc-deny", claude)
            body = {"decision": "deny", "message": "not in this repo, please"}
            decided = await http.post(f"/api/approvals/{pending['approvalId']}/decision", json=body)
            assert decided.status_code == 200, decided.text
            run = await claude
        finally:
            stub.__exit__(None, None, None)
            await live.__aexit__(None, None, None)
        assert run.returncode == 0, run.stderr[-2000:]
        assert not denied.exists()
        (result,) = stub.turns[-1].tool_results
        assert "not in this repo, please" in stub.turns[-1].tool_result_text(result)


async def test_it_lets_a_policy_rule_allow_without_anyone(daphne_server, tmp_path, operator_token):
    token = await sync_to_async(lambda: tokens.create_runner("claude-host")[1])()
    auth = {"Authorization": f"Bearer {operator_token}"}
    target = tmp_path / "by-policy.txt"
    async with httpx.AsyncClient(base_url=daphne_server.http_url, headers=auth, timeout=30) as http:
        live = await LiveRunner(daphne_server, token).__aenter__()
        try:
            await live.open("cc-policy")
            policy = {
                "rules": [{"match": {"tool": "Bash", "input": "touch *"}, "decision": "allow"}]
            }
            put = await http.put("/api/runs/cc-policy/approval-policy", json=policy)
            assert put.status_code == 200, put.text
            issued = await live.run_token("cc-policy")
            servers = {
                "canopy": {
                    "type": "http",
                    "url": issued["url"],
                    "headers": {"Authorization": f"Bearer {issued['token']}"},
                }
            }
            with ModelStub(_script(target)) as stub:
                run = await asyncio.to_thread(
                    run_claude,
                    f"Create the file {target}.",
                    model_url=stub.url,
                    home=tmp_path / "policy",
                    mcp_servers=servers,
                    extra_args=PROMPT_TOOL,
                    env=CLI_ENV,
                )
        finally:
            await live.__aexit__(None, None, None)
        assert run.returncode == 0, run.stderr[-2000:]
        assert target.exists()
        (approval,) = (await http.get("/api/approvals", params={"run": "cc-policy"})).json()[
            "items"
        ]
        assert (approval["status"], approval["decision"], approval["decidedBy"]) == (
            "decided",
            "allow",
            "policy",
        )
        assert json.loads(json.dumps(approval["input"]))["command"] == f"touch {target}"


@pytest.mark.own_server
async def test_it_denies_when_nobody_decides_in_time(daphne_factory, tmp_path, operator_token):
    server = daphne_factory(APPROVAL_TIMEOUT_SECONDS=2, MAINTENANCE_INTERVAL_SECONDS=0.2)
    token = await sync_to_async(lambda: tokens.create_runner("claude-host")[1])()
    target = tmp_path / "never.txt"
    live, claude, stub = await _agent(server, token, "cc-timeout", tmp_path, target)
    try:
        run = await claude
    finally:
        stub.__exit__(None, None, None)
        await live.__aexit__(None, None, None)
    assert run.returncode == 0, run.stderr[-2000:]
    assert not target.exists()
    (result,) = stub.turns[-1].tool_results
    assert "no decision within 2 s" in stub.turns[-1].tool_result_text(result)
    auth = {"Authorization": f"Bearer {operator_token}"}
    async with httpx.AsyncClient(base_url=server.http_url, headers=auth, timeout=30) as http:
        (approval,) = (await http.get("/api/approvals", params={"run": "cc-timeout"})).json()[
            "items"
        ]
    assert (approval["status"], approval["decidedBy"]) == ("expired", "timeout")

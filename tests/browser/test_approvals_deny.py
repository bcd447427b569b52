"""Denying from the approvals inbox in Chromium (SPEC §11) with real Claude Code: the pinned
CLI, offline, asks to ``touch`` a file; an operator types a message and clicks Deny; REST
records the approval decided ``deny`` with that message, the file is never made, and the
model reads the message in its tool result."""

from __future__ import annotations

import threading

import pytest

from delegation.models import Approval
from delegation.runner.model_stub import ModelStub, Steps
from tests.support.agents.claude_cli import run_claude
from tests.support.browser import needs_chromium, sign_in
from tests.support.personas import PASSWORD

pytestmark = [
    pytest.mark.django_db(transaction=True),
    needs_chromium,
    pytest.mark.timeout(180),
]

WHY = "not in this repo, please"


def test_it_lets_an_operator_deny_claude_codes_command_with_a_message(
    server, runner, browser, operator, tmp_path
):
    target = tmp_path / "denied-from-the-inbox.txt"
    runner.open("cc-inbox-deny")
    issued = runner.call("run.mcpToken", {"runId": "cc-inbox-deny"})
    servers = {
        "canopy": {
            "type": "http",
            "url": issued["url"],
            "headers": {"Authorization": f"Bearer {issued['token']}"},
        }
    }
    script = Steps(
        "Bash",
        {"command": f"touch {target}", "description": "Create the marker"},
        answer=lambda r: "Tool said: " + r.tool_result_text(r.tool_results[-1]),
    )
    finished = {}
    with ModelStub(script) as stub:

        def agent():
            finished["run"] = run_claude(
                f"Create {target}.",
                model_url=stub.url,
                home=tmp_path / "home",
                mcp_servers=servers,
                extra_args=["--permission-prompt-tool", "mcp__canopy__approve"],
                env={"MCP_TOOL_TIMEOUT": "120000"},
                timeout=150,
            )

        thread = threading.Thread(target=agent, daemon=True)
        thread.start()
        page = browser()
        sign_in(page, server.http_url, operator.username, PASSWORD)
        page.goto(f"{server.http_url}/approvals/")
        page.wait_for_selector("#approvals [data-approval-id] [data-action=deny]")
        page.fill("#approvals [data-approval-id] [name=message]", WHY)
        page.click("#approvals [data-action=deny]")
        page.wait_for_selector("#approvals [data-role=outcome]:has-text('deny by operator:')")
        thread.join(120)
        run = finished["run"]
        assert run.returncode == 0, run.stderr[-2000:]
    assert not target.exists()
    (result,) = stub.turns[-1].tool_results
    assert WHY in stub.turns[-1].tool_result_text(result)

    approval = Approval.objects.get(run__run_id="cc-inbox-deny")
    response = page.request.get(f"{server.http_url}/api/approvals/{approval.approval_id}")
    assert response.ok, response.text()
    record = response.json()
    assert (record["decision"], record["message"]) == ("deny", WHY), record

"""The approvals inbox in Chromium (SPEC §11) with real Claude Code: the pinned CLI,
offline, asks to ``touch`` a file; the approval shows in the inbox (and its count in the
navigation); an operator allows it with a click and the file exists; a viewer sees the
approval without any button to decide it."""

from __future__ import annotations

import json
import threading

import pytest

from delegation.models import ApprovalPolicy
from delegation.runner.model_stub import ModelStub, Steps
from tests.support.agents.claude_cli import run_claude
from tests.support.browser import needs_chromium, sign_in
from tests.support.personas import PASSWORD

pytestmark = [
    pytest.mark.django_db(transaction=True),
    needs_chromium,
    pytest.mark.timeout(180),
]


def test_it_lets_an_operator_allow_claude_codes_command_from_the_inbox(
    server, runner, browser, operator, viewer, tmp_path
):
    target = tmp_path / "from-the-inbox.txt"
    runner.open("cc-inbox")
    issued = runner.call("run.mcpToken", {"runId": "cc-inbox"})
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
        watcher = browser()
        sign_in(watcher, server.http_url, viewer.username, PASSWORD)
        watcher.goto(f"{server.http_url}/approvals/")
        seen = watcher.wait_for_selector("#approvals [data-approval-id] [data-field=input]")
        assert f"$ touch {target}" in seen.text_content()
        assert watcher.query_selector("#approvals [data-action=allow]") is None

        page = browser()
        sign_in(page, server.http_url, operator.username, PASSWORD)
        page.goto(f"{server.http_url}/approvals/")
        page.wait_for_selector("[data-role=approvals-count]:text-is('1')")
        assert not target.exists()
        page.click("#approvals [data-action=allow]")
        page.wait_for_selector("#approvals [data-role=outcome]:has-text('allow by operator:')")
        thread.join(120)
        run = finished["run"]
        assert run.returncode == 0, run.stderr[-2000:]
    assert target.exists()
    (result,) = stub.turns[-1].tool_results
    assert not result.get("is_error"), json.dumps(result)
    page.goto(f"{server.http_url}/approvals/")
    page.wait_for_selector("#approvals [data-role=empty]")
    assert page.text_content("[data-role=approvals-count]") == "0"

    # The run page's policy editor writes the run's policy (through the REST PUT).
    page.goto(f"{server.http_url}/runs/cc-inbox/")
    rule = {"match": {"tool": "Bash", "input": "touch *"}, "decision": "allow"}
    page.fill("#policy-form [name=policy]", json.dumps({"rules": [rule], "default": "ask"}))
    page.click("#policy-form [data-action=save-policy]")
    page.wait_for_selector("#policy-form [data-role=policy-outcome]:text-is('Policy saved.')")
    stored = ApprovalPolicy.objects.get(run__run_id="cc-inbox")
    assert (stored.rules, stored.source) == ([rule], "operator")

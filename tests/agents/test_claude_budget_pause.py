"""Budgets that pause (SPEC §14 ``onLimit: "pause"``) with real Claude Code, offline: the
README's ``claude`` preset on the pinned CLI, sandboxed, against the scripted model. A root
whose tree may use 1,000 tokens delegates one child, and the child's answer costs 5,000: the
tree pauses and one ``budget`` item waits in the inbox. Allowing it with a raised limit resumes
the root, which finishes succeeded; denying it cancels the tree."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Run
from delegation.runner.model_stub import Text, ToolCall
from tests.support.agents.delegating import wait_for
from tests.support.real_agents import claude_over_rest

pytestmark = [
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(200),
]

DELEGATE = "mcp__canopy__delegate"
SMALL = {"input_tokens": 10, "output_tokens": 5}  # every reply but the child's is cheap


def script(request):
    if DELEGATE not in request.tool_names:
        return Text("ok", **SMALL)  # the CLI's side requests
    if "CHILD-TASK" in repr(request.messages[:1]):
        return Text("child done", input_tokens=5000, output_tokens=10)
    if not request.tool_uses:
        arguments = {"profile": "claude", "message": "CHILD-TASK: answer", "waitSeconds": 50}
        return ToolCall(DELEGATE, arguments, text="delegating", **SMALL)
    return Text("root done", **SMALL)


async def paused_tree(decision: dict, daphne_server, tmp_path, operator) -> tuple[Run, dict]:
    """Run the tree to its budget, decide the inbox item with ``decision``; the root at its
    end and the budget item as REST showed it while pending."""
    async with claude_over_rest(
        script, server=daphne_server, tmp_path=tmp_path, operator=operator, name="claude-budget"
    ) as (host, http):
        budget = {"maxTokens": 1000, "onLimit": "pause"}
        root = await host.open_root("ROOT-TASK: delegate", profile="claude", budget=budget)

        async def pending():
            page = (await http.get("/api/approvals", params={"status": "pending"})).json()
            return next((a for a in page["items"] if a["kind"] == "budget"), None)

        item = await wait_for(pending, what="the budget item in the inbox")
        status = (await http.get(f"/api/runs/{root.run_id}")).json()["status"]
        assert status == "paused", status
        url = f"/api/approvals/{item['approvalId']}/decision"
        answer = await http.post(url, json=decision)
        assert answer.status_code == 200, answer.text
        await host.wait(root.run_id, timeout=90)
    return await sync_to_async(Run.objects.get)(run_id=root.run_id), item


async def test_a_real_claude_code_tree_pauses_at_its_budget_and_resumes_when_raised(
    daphne_server, tmp_path, operator
):
    raise_it = {"decision": "allow", "updatedInput": {"limits": {"maxTokens": 100000}}}
    root, item = await paused_tree(raise_it, daphne_server, tmp_path, operator)
    assert item["input"]["limit"] == "maxTokens"
    assert root.status == "succeeded", root.error
    assert root.output == "root done"


async def test_a_real_claude_code_tree_paused_at_its_budget_is_cancelled_when_denied(
    daphne_server, tmp_path, operator
):
    root, _item = await paused_tree({"decision": "deny"}, daphne_server, tmp_path, operator)
    assert root.status == "cancelled", root.status

"""Budgets that pause (SPEC §14 ``onLimit: "pause"``): at the limit the whole subtree pauses
in one step, one approval of kind ``budget`` appears, a ``budget-paused`` webhook is queued;
allowing it with raised limits resumes the subtree, denying it cancels the subtree."""

from __future__ import annotations

import pytest

from delegation.models import Approval, Budget, Event, Run, Webhook, WebhookDelivery
from delegation.services import approvals
from delegation.services.identity import Actor
from tests.support.rpc import adb

pytestmark = pytest.mark.django_db(transaction=True)


def usage(tokens_in=0, tokens_out=0) -> dict:
    return {"kind": "usage", "input": {"inputTokens": tokens_in, "outputTokens": tokens_out}}


def statuses() -> dict[str, str]:
    return dict(Run.objects.values_list("run_id", "status"))


async def cross_a_paused_budget(runner):
    await runner.open("root-1", budget={"maxTokens": 100, "onLimit": "pause"})
    child = await runner.start("root-1", "c1")
    grandchild = await runner.start(child["runId"], "g1")
    everyone = ["root-1", child["runId"], grandchild["runId"]]
    await runner.emit(grandchild["runId"], [usage(60, 60)])  # 120 of 100: crossed
    for run_id in everyone:
        await runner.wait_command("run.pause", runId=run_id)
    return everyone


async def test_it_pauses_the_subtree_and_raising_the_limit_resumes_it(runner, operator):
    await adb(Webhook.objects.create)(
        url="http://127.0.0.1:9/hook", secret="s" * 16, kinds=["budget-paused"]
    )
    everyone = await cross_a_paused_budget(runner)
    assert set((await adb(statuses)()).values()) == {"paused"}
    assert not await adb(Run.objects.filter(cancel_requested_at__isnull=False).exists)()
    approval = await adb(Approval.objects.get)(kind="budget")
    assert (
        approval.status == "pending"
        and approval.run_id == (await adb(Run.objects.get)(run_id="root-1")).pk
    )
    assert approval.input["limit"] == "maxTokens" and approval.input["limits"]["maxTokens"] == 100
    assert "budget exceeded: maxTokens" in approval.title
    paused = await adb(Event.objects.get)(run__run_id="root-1", kind="budget-paused")
    assert set(paused.data["paused"]) == set(everyone)
    assert await adb(WebhookDelivery.objects.filter(kind="budget-paused").count)() == 1
    # While paused, nothing more starts under it: a paused parent is not running.
    error = await runner.error("child.start", runner.start_params("root-1", "late"))
    assert error["code"] == -32014

    actor = Actor.for_user(operator, "api")
    await adb(approvals.do_decide_approval)(
        actor=actor,
        approval=approval,
        decision="allow",
        updated_input={"limits": {"maxTokens": 1000}},
    )
    for run_id in everyone:
        await runner.wait_command("run.resume", runId=run_id)
    assert set((await adb(statuses)()).values()) == {"running"}
    budget = await adb(Budget.objects.get)(run__run_id="root-1")
    assert budget.max_tokens == 1000 and budget.exceeded_at is None
    # The tree goes on and finishes succeeded.
    for run_id in reversed(everyone):
        await runner.finish(run_id, output="ok")
    assert set((await adb(statuses)()).values()) == {"succeeded"}


async def test_it_cancels_the_subtree_when_the_budget_approval_is_denied(runner, operator):
    everyone = await cross_a_paused_budget(runner)
    approval = await adb(Approval.objects.get)(kind="budget")
    actor = Actor.for_user(operator, "api")
    await adb(approvals.do_decide_approval)(actor=actor, approval=approval, decision="deny")
    for run_id in everyone:
        await runner.wait_command("run.cancel", runId=run_id)
    runs = await adb(lambda: list(Run.objects.all()))()
    assert all(r.cancel_requested_at is not None for r in runs)
    assert all("cancelled by user:" in r.cancel_reason for r in runs)


async def test_it_keeps_cancel_as_the_default(runner):
    await runner.open("root-1", budget={"maxTokens": 100})
    await runner.emit("root-1", [usage(60, 60)])
    await runner.wait_command("run.cancel", runId="root-1")
    assert not await adb(Approval.objects.filter(kind="budget").exists)()
    assert (await adb(Budget.objects.get)(run__run_id="root-1")).on_limit == "cancel"

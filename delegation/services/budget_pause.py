"""A budget that pauses (SPEC §14 ``onLimit: "pause"``): at its limit the whole subtree
pauses in one step and one approval of kind ``budget`` asks an operator to raise the limit
(allow, with ``updatedInput: {"limits": {...}}``) or to cancel the subtree (deny).

The decision itself is handled in ``budgets`` (it raises limits and cancels subtrees), which
the approvals service calls for approvals of this kind.
"""

from __future__ import annotations

import uuid

from delegation import notify
from delegation.models import Approval, Budget, Run
from delegation.selectors import live_descendants
from delegation.services import webhooks
from delegation.services.base import lock_run, store_server_event
from delegation.services.identity import Actor
from delegation.services.pause import request_pause

KIND = "budget"
BUDGET_ACTOR = Actor(label="budget", via="system")


def pause_subtree(run: Run, reason: str) -> list[str]:
    """Pause the budget's run and every live run below it; the runIds paused."""
    paused = []
    for each in [run, *live_descendants(run)]:
        if request_pause(BUDGET_ACTOR, each, reason) == "paused":
            paused.append(each.run_id)
    return paused


def pause_at_limit(run: Run, budget: Budget, reason: str, name: str, used, cap) -> Approval:
    """The subtree paused, one pending approval of kind ``budget`` on the budget's run, a
    ``budget-paused`` event and webhook. The caller holds ``run`` locked."""
    paused = pause_subtree(run, reason)
    run = lock_run(run.pk)  # as the pause left it: its stream's head moved
    title = f"{reason}: raise the limit and resume, or cancel the subtree"
    detail = {"limit": name, "cap": cap, "used": used, "budgetRunId": run.run_id}
    approval = Approval.objects.create(
        approval_id=f"ap-{uuid.uuid4().hex}",
        run=run,
        root_id=run.root_id or run.pk,
        via=KIND,
        can_edit=True,
        tool_name=KIND,
        kind=KIND,
        title=title[:1024],
        input={**detail, "limits": limits_now(budget)},
    )
    data = {**detail, "approvalId": approval.approval_id, "paused": paused}
    store_server_event(run, "budget-paused", actor=BUDGET_ACTOR.label, text=title, data=data)
    store_server_event(
        run,
        "approval-requested",
        actor=BUDGET_ACTOR.label,
        text=title[:500],
        tool_name=KIND,
        input=approval.input,
        data={"approvalId": approval.approval_id, "kind": KIND},
    )
    webhooks.enqueue_alert("budget-paused", {**webhooks.run_payload(run), "reason": reason, **data})
    notify.approvals_changed()
    return approval


def limits_now(budget: Budget) -> dict:
    out = {}
    for name, column in (
        ("maxRuns", "max_runs"),
        ("maxLive", "max_live"),
        ("maxTokens", "max_tokens"),
        ("maxSeconds", "max_seconds"),
    ):
        if getattr(budget, column) is not None:
            out[name] = getattr(budget, column)
    if budget.max_cost_nanos is not None:
        out["maxCostUsd"] = budget.max_cost_nanos / 1_000_000_000
    return out

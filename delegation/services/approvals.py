"""Approvals (SPEC §11): the one service every door calls. A request is decided by policy
at once or stored pending; a pending one is decided once, by an operator, a policy change,
the timeout or a cancel. Persist first: the decision, its event and (for the runner door)
the ``approval.decided`` command commit together; doorbells ring after commit.

Lock order (``locks``): the run rows (the tree's root before the run, when "allow always"
writes the root's policy), then the approval row.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from delegation import metrics, notify
from delegation.errors import INVALID_PARAMS, NO_SUCH_RUN, REQUEST_ID_REUSED, RpcError
from delegation.models import Approval, ApprovalPolicy, ApprovalStatus, Command, Run
from delegation.selectors.approvals import approved_input, policy_chain
from delegation.services import webhooks
from delegation.services.approval_policy import allow_always_rule, effective, flatten
from delegation.services.audit import audit, require_operator
from delegation.services.base import lock_run, store_server_event
from delegation.services.identity import Actor
from delegation.services.locks import retry_conflicts
from delegation.services.outbox import enqueue
from delegation.services.secret_answers import stored_message
from delegation.wire import canonical, parse_model, utf8_len
from delegation.wire.approvals import Policy

MAX_INPUT_BYTES = 256 * 1024
VIA_RUNNER = "runner"
VIA_MCP = "mcp"


class AlreadyDecided(Exception):
    """A second decision: nothing changes; the doors answer 409 naming the first."""

    def __init__(self, approval: Approval):
        self.approval = approval
        first = f"{approval.decision} by {approval.decided_by}"
        if approval.decided_at is not None:
            first += f" at {approval.decided_at.isoformat()}"
        super().__init__(f"approval {approval.approval_id} was already decided: {first}")


class EditNotSupported(Exception):
    """An edited input for an approval whose door cannot run one: the doors answer 409
    ``edit_not_supported_by_door``, and nothing is decided."""

    code = "edit_not_supported_by_door"

    def __init__(self, approval: Approval):
        self.approval = approval
        super().__init__(
            f"updatedInput: approval {approval.approval_id} came through {door_name(approval)}, "
            "which cannot run an edited input (an ACP agent answers a permission request with "
            "an option id only); allow or deny the input as asked"
        )


def door_name(approval: Approval) -> str:
    """The door an approval came through, as a person reads it."""
    if approval.via == VIA_MCP:
        return "the MCP approve tool"
    if not approval.can_edit:
        return "the runner's ACP door (approval.request with canEdit false)"
    return "the runner's approval.request"


def check_edit(approval: Approval, updated_input) -> None:
    """An edit is offered only where the door runs it, so the record holds what ran."""
    if updated_input is not None and not approval.can_edit:
        raise EditNotSupported(approval)


@dataclass(frozen=True)
class ToolUse:
    """What an agent asks to do."""

    tool_name: str
    input: object
    tool_call_id: str = ""
    kind: str = ""
    title: str = ""
    # False where the door cannot run an edited input (an ACP agent takes an option id only).
    can_edit: bool = True


# --- Requests ----------------------------------------------------------------------------


def _check_request(use: ToolUse) -> None:
    if not use.tool_name.strip():
        raise RpcError(INVALID_PARAMS, "toolName: must not be blank")
    if utf8_len(canonical(use.input)) > MAX_INPUT_BYTES:
        raise RpcError(INVALID_PARAMS, f"input: must be at most {MAX_INPUT_BYTES} bytes as JSON")


def check_same_request(existing: Approval, use: ToolUse) -> None:
    """A decision answers only its own request (SPEC §11): a reused toolCallId must carry the
    tool and input it was first asked with, or an allowed ``ls`` would let ``rm -rf /`` through."""
    changed = [
        field
        for field, same in (
            ("toolName", existing.tool_name == use.tool_name),
            ("input", canonical(existing.input) == canonical(use.input)),
        )
        if not same
    ]
    if changed:
        raise RpcError(
            REQUEST_ID_REUSED,
            f"toolCallId {use.tool_call_id!r} was already asked about with another "
            f"{' and '.join(changed)} (approval {existing.approval_id}); "
            "a new tool use needs a new toolCallId",
        )


@retry_conflicts
def do_request_approval(*, run: Run, use: ToolUse, via: str, actor_label: str) -> Approval:
    """Decide ``use`` by the run's effective policy, or store it pending.

    Idempotent by (run, toolCallId): a repeated request answers the stored approval; the
    same toolCallId with another tool or input is refused (−32013), never given its decision.
    """
    _check_request(use)
    with transaction.atomic():
        run = lock_run(run.pk)
        if use.tool_call_id:
            existing = Approval.objects.filter(run=run, tool_call_id=use.tool_call_id).first()
            if existing is not None:
                check_same_request(existing, use)
                return existing
        if run.is_terminal or run.cancel_requested_at is not None:
            raise RpcError(NO_SUCH_RUN, f"run {run.run_id} is not running: nothing to approve")
        approval = Approval.objects.create(
            approval_id=f"ap-{uuid.uuid4().hex}",
            run=run,
            root_id=run.root_id or run.pk,
            via=via,
            can_edit=use.can_edit,
            tool_call_id=use.tool_call_id,
            tool_name=use.tool_name,
            kind=use.kind,
            title=use.title,
            input=use.input,
        )
        store_server_event(
            run,
            "approval-requested",
            actor=actor_label,
            text=use.title or f"{use.tool_name}: {flatten(use.input)}"[:500],
            tool_name=use.tool_name,
            tool_call_id=use.tool_call_id or None,
            input=use.input,
            data={"approvalId": approval.approval_id, "kind": use.kind},
        )
        decision = effective(policy_chain(run), tool=use.tool_name, kind=use.kind, input=use.input)
        if decision in ("allow", "deny"):
            message = "" if decision == "allow" else "denied by policy"
            decide(approval, run, decision=decision, by="policy", message=message)
        else:
            webhooks.enqueue_alert("approval-requested", _alert_payload(approval, run))
            transaction.on_commit(metrics.approval_requested)
            notify.approvals_changed()
        return approval


def _alert_payload(approval: Approval, run: Run) -> dict:
    return {
        "approvalId": approval.approval_id,
        "runId": run.run_id,
        "rootRunId": run.root.run_id if run.root_id else run.run_id,
        "depth": run.depth,
        "toolName": approval.tool_name,
        "kind": approval.kind,
        "input": flatten(approval.input)[:2000],
    }


# --- Decisions ---------------------------------------------------------------------------


def decide(
    approval: Approval,
    run: Run,
    *,
    decision: str,
    by: str,
    message: str = "",
    updated_input=None,
    scope: str = "once",
    status: str = ApprovalStatus.DECIDED,
) -> None:
    """Record the one decision; the caller holds ``run`` and ``approval`` locked. Only the
    runner's command carries a secret answer (see ``secret_answers``)."""
    answer, message = message, stored_message(approval, message)
    approval.status = status
    approval.decision = decision
    approval.message = message
    approval.updated_input = updated_input
    approval.scope = scope
    approval.decided_by = by
    approval.decided_at = timezone.now()
    approval.save(
        update_fields=[
            "status",
            "decision",
            "message",
            "updated_input",
            "scope",
            "decided_by",
            "decided_at",
        ]
    )
    text = f"{approval.tool_name}: {decision} by {by}" + (f" ({message})" if message else "")
    store_server_event(
        run,
        "approval-decided",
        actor=by,
        text=text,
        tool_name=approval.tool_name,
        tool_call_id=approval.tool_call_id or None,
        data={
            "approvalId": approval.approval_id,
            "decision": decision,
            "status": status,
            "scope": scope,
            "decidedBy": by,
            "message": message,
        },
    )
    if approval.via == VIA_RUNNER:
        params = {"approvalId": approval.approval_id, "runId": run.run_id, "decision": decision}
        if answer:
            params["message"] = answer
        if decision == "allow":
            params["updatedInput"] = approved_input(approval)
        enqueue(run.runner_id, Command.Method.APPROVAL_DECIDED, params, run=run)
    latency = (approval.decided_at - approval.requested_at).total_seconds()
    transaction.on_commit(lambda: metrics.approval_decided(by.split(":")[0], latency))
    # Every decision (operator, policy, timeout, cancel) passes here: the inboxes re-read.
    notify.approvals_changed()


def _lock_approval(approval_pk: int) -> Approval:
    return Approval.objects.select_for_update(of=("self",)).get(pk=approval_pk)


# Approvals that are a question to the operator, not a tool the agent may use again: an
# "allow always" rule would answer every later one unasked (an extension's ui.input with an
# empty string, a budget's raise without a look).
ONCE_ONLY_KINDS = ("question", "budget")


@retry_conflicts
def do_decide_approval(
    *,
    actor: Actor,
    approval: Approval,
    decision: str,
    message: str = "",
    updated_input=None,
    scope: str = "once",
    scope_run: str = "run",
) -> Approval:
    """An operator's decision (REST, the inbox, the run page, the admin), audited."""
    require_operator(actor, "approve", "approval", approval.approval_id)
    if decision == "deny" and updated_input is not None:
        raise RpcError(INVALID_PARAMS, "updatedInput: only an allow may edit the input")
    if decision == "deny" and scope == "always":
        raise RpcError(INVALID_PARAMS, "scope: 'always' adds an allow rule; a deny is once")
    if scope == "always" and approval.kind in ONCE_ONLY_KINDS:
        raise RpcError(
            INVALID_PARAMS,
            f"scope: a {approval.kind} is answered once; 'always' adds an allow rule for a tool",
        )
    # Before the locks: a door's capability is fixed when the approval is stored.
    check_edit(approval, updated_input)
    with transaction.atomic():
        root_pk = approval.root_id
        rule_run = None
        if scope == "always" and scope_run == "root" and root_pk != approval.run_id:
            rule_run = lock_run(root_pk)
        run = lock_run(approval.run_id)
        if scope == "always" and rule_run is None:
            rule_run = run
        approval = _lock_approval(approval.pk)
        if approval.status != ApprovalStatus.PENDING:
            first = AlreadyDecided(approval)
        else:
            first = None
            _decide_by_operator(
                actor, approval, run, rule_run, decision, message, updated_input, scope
            )
    if first is not None:
        # Audited in its own transaction, after the one that changed nothing.
        with transaction.atomic():
            audit(actor, "approve", "approval", approval.approval_id, "already-decided")
        raise first
    if rule_run is not None:
        reevaluate_pending(rule_run)
    return approval


# What an approval that is no agent's tool use does once decided, by kind (SPEC §14: a
# budget's "raise and resume, or cancel"); registered by the services above this one.
DECISION_HOOKS: dict = {}


def _decide_by_operator(actor, approval, run, rule_run, decision, message, updated_input, scope):
    """The decision, its "allow always" rule and its audit entry (all under the locks)."""
    by = f"operator:{actor.user.get_username()}" if actor.user is not None else actor.label
    decide(
        approval,
        run,
        decision=decision,
        by=by,
        message=message,
        updated_input=updated_input,
        scope=scope,
    )
    if rule_run is not None:
        _add_rule(rule_run, allow_always_rule(approval.tool_name, approval.input))
    hook = DECISION_HOOKS.get(approval.kind) if approval.via == approval.kind else None
    if hook is not None:
        hook(actor, approval, run, decision, updated_input)
    audit(
        actor,
        "approve",
        "approval",
        approval.approval_id,
        decision,
        reason=approval.message,  # a secret answer's stand-in (see decide)
        detail={
            "runId": run.run_id,
            "toolName": approval.tool_name,
            "scope": scope,
            "ruleOn": rule_run.run_id if rule_run is not None else "",
            "edited": updated_input is not None,
        },
    )


def _add_rule(run: Run, rule: dict) -> None:
    policy, _ = ApprovalPolicy.objects.get_or_create(run=run)
    if rule not in policy.rules:
        # First: an operator's allow outranks the rules already there, the default after.
        policy.rules = [rule, *policy.rules]
    policy.source = "operator"
    policy.updated_at = timezone.now()
    policy.save()


# --- Policies ----------------------------------------------------------------------------


def check_policy(raw, field: str = "approvals") -> dict:
    """A policy ``{rules, default}`` validated strictly (−32602 naming the field)."""
    return parse_model(Policy, raw, prefix=field).plain()


def store_policy(run: Run, policy: dict, *, source: str) -> None:
    """Set ``run``'s own policy (inside the creating or updating transaction)."""
    ApprovalPolicy.objects.update_or_create(
        run=run,
        defaults={
            "rules": policy["rules"],
            "default": policy["default"],
            "source": source,
            "updated_at": timezone.now(),
        },
    )


@retry_conflicts
def do_set_policy(*, actor: Actor, run: Run, policy: dict, reason: str = "") -> dict:
    """An operator replaces a run's own policy (audited); pending approvals it now decides
    in the run's subtree are decided by ``policy``."""
    require_operator(actor, "approval-policy", "run", run.run_id, reason)
    with transaction.atomic():
        run = lock_run(run.pk)
        before = ApprovalPolicy.objects.filter(run=run).first()
        store_policy(run, policy, source="operator")
        audit(
            actor,
            "approval-policy",
            "run",
            run.run_id,
            "set",
            reason=reason,
            detail={"before": before.wire() if before else None, "after": policy},
        )
    reevaluate_pending(run)
    return policy


def reevaluate_pending(run: Run) -> list[str]:
    """Decide, each in its own transaction, the pending approvals in ``run``'s subtree that
    its chain's policies now decide."""
    decided = []
    subtree = Run.objects.in_tree(run.root_id or run.pk)
    rows = Approval.objects.filter(status=ApprovalStatus.PENDING, run__in=subtree)
    for pk, run_pk in rows.values_list("pk", "run_id"):
        if _reevaluate_one(pk, run_pk):
            decided.append(pk)
    return decided


def _by_policy(run: Run, approval: Approval) -> dict | None:
    decision = effective(
        policy_chain(run), tool=approval.tool_name, kind=approval.kind, input=approval.input
    )
    if decision == "ask":
        return None
    message = "" if decision == "allow" else "denied by policy"
    return {"decision": decision, "by": "policy", "message": message}


def _reevaluate_one(approval_pk: int, run_pk: int) -> bool:
    return decide_if_pending(approval_pk, run_pk, _by_policy)


@retry_conflicts
def decide_if_pending(approval_pk: int, run_pk: int, choose) -> bool:
    """Under the locks, if still pending: ``choose(run, approval)``'s decision, if any."""
    with transaction.atomic():
        run = lock_run(run_pk)
        approval = _lock_approval(approval_pk)
        if approval.status != ApprovalStatus.PENDING:
            return False
        chosen = choose(run, approval)
        if chosen is None:
            return False
        decide(approval, run, **chosen)
        return True

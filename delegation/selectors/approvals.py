"""Reads of SPEC §11: an approval as the wire shows it, the inbox, and a run's policy."""

from __future__ import annotations

from django.db.models import Q
from django.utils import timezone

from delegation.models import Approval, ApprovalPolicy, ApprovalStatus, Run

RELATED = ("run", "run__runner", "root")


def approval_wire(approval: Approval) -> dict:
    """The one shape of an approval (REST, the rpc answer, the inbox)."""
    answer = {
        "approvalId": approval.approval_id,
        "runId": approval.run.run_id,
        # Names before ids (issue 38): the run's task and its tree's, as the dashboard shows.
        "task": approval.run.task,
        "rootRunId": approval.root.run_id,
        "rootTask": approval.root.task,
        "depth": approval.run.depth,
        "profile": approval.run.profile,
        "runner": approval.run.runner.name,
        "via": approval.via,
        # Whether the door runs an operator's edit: the inbox offers "edit, then allow" only then.
        "canEdit": approval.can_edit,
        "toolCallId": approval.tool_call_id,
        "toolName": approval.tool_name,
        "kind": approval.kind,
        "title": approval.title,
        "input": approval.input,
        "status": approval.status,
        "decision": approval.decision,
        "message": approval.message,
        "updatedInput": approval.updated_input,
        "scope": approval.scope,
        "decidedBy": approval.decided_by,
        "requestedAt": approval.requested_at.isoformat(),
        "decidedAt": approval.decided_at.isoformat() if approval.decided_at else None,
    }
    return answer


def rpc_answer(approval: Approval) -> dict:
    """``approval.request``'s answer: ``{approvalId, status, decision?, message?, updatedInput?}``."""
    answer = {"approvalId": approval.approval_id, "status": approval.status}
    if approval.status != ApprovalStatus.PENDING:
        answer["status"] = "decided"
        answer["decision"] = approval.decision
        if approval.message:
            answer["message"] = approval.message
        if approval.decision == "allow":
            answer["updatedInput"] = approved_input(approval)
    return answer


def approved_input(approval: Approval):
    return approval.updated_input if approval.updated_input is not None else approval.input


def get_approval(approval_id: str) -> Approval | None:
    return Approval.objects.select_related(*RELATED).filter(approval_id=approval_id).first()


def approval_state(approval_pk: int) -> Approval:
    return Approval.objects.select_related(*RELATED).get(pk=approval_pk)


def approvals_matching(*, status=None, run_id=None, root_run_id=None, tool=None):
    rows = Approval.objects.select_related(*RELATED)
    if status:
        rows = rows.filter(status=status)
    if run_id:
        rows = rows.filter(run__run_id=run_id)
    if root_run_id:
        rows = rows.filter(root__run_id=root_run_id)
    if tool:
        rows = rows.filter(tool_name=tool)
    return rows.order_by("requested_at", "id")


def pending_approvals(limit: int = 500) -> list[Approval]:
    """The inbox: every pending approval across trees, oldest first."""
    return list(approvals_matching(status=ApprovalStatus.PENDING)[:limit])


def pending_count() -> int:
    return Approval.objects.filter(status=ApprovalStatus.PENDING).count()


def pending_of_run(run: Run) -> list[Approval]:
    return list(approvals_matching(status=ApprovalStatus.PENDING).filter(run=run))


def pending_by_root() -> dict[int, int]:
    """Pending approvals per tree root pk (the trees overview and tree rows)."""
    from django.db.models import Count

    rows = (
        Approval.objects.filter(status=ApprovalStatus.PENDING)
        .values("root_id")
        .annotate(n=Count("id"))
    )
    return {row["root_id"]: row["n"] for row in rows}


def pending_in_tree(root_pk: int, since=None) -> dict[int, tuple[int, int]]:
    """Pending approvals of a tree by run pk: ``(own, subtree)`` (the subtree count includes
    the run's own), for the tree page's rows. One read on the (root, status) index: pending
    approvals are few even in a 100k-run tree, so each one is added up its ancestry here
    rather than kept in the rollups. With ``since``, the pks whose counts may have moved
    (a request or decision after it, and their ancestors) instead."""
    rows = Approval.objects.filter(root_id=root_pk)
    if since is not None:
        rows = rows.filter(Q(requested_at__gte=since) | Q(decided_at__gte=since))
    else:
        rows = rows.filter(status=ApprovalStatus.PENDING)
    counts: dict[int, list[int]] = {}
    for run_pk, ancestry in rows.values_list("run_id", "run__ancestry"):
        counts.setdefault(run_pk, [0, 0])[0] += 1
        for pk in [*(ancestry or []), run_pk]:
            counts.setdefault(pk, [0, 0])[1] += 1
    return {pk: (own, sub) for pk, (own, sub) in counts.items()}


def policy_of(run: Run) -> dict | None:
    policy = ApprovalPolicy.objects.filter(run=run).first()
    return policy.wire() if policy is not None else None


def policy_chain(run: Run) -> list[tuple[dict, bool]]:
    """The policies of ``run``'s ancestors and itself, root first: ``(policy, trusted)``."""
    chain_pks = [*(run.ancestry or []), run.pk]
    found = {p.run_id: p for p in ApprovalPolicy.objects.filter(run_id__in=chain_pks)}
    return [(found[pk].wire(), found[pk].source != "agent") for pk in chain_pks if pk in found]


def age_seconds(approval: Approval, now=None) -> int:
    return int(((now or timezone.now()) - approval.requested_at).total_seconds())

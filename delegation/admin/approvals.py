"""Approvals in the admin (SPEC §11): read-only rows; allow or deny selected pending ones
through the one approvals service (role-checked and audited like every other door)."""

from __future__ import annotations

from django.contrib import admin

from delegation.admin.base import RoleAdmin, admin_actor, report_outcomes
from delegation.errors import PermissionRefused, RpcError
from delegation.models import Approval, ApprovalPolicy
from delegation.services import approvals


def _decide(modeladmin, request, queryset, decision: str):
    done, refused = [], []
    for approval in queryset.select_related("run", "root"):
        try:
            approvals.do_decide_approval(
                actor=admin_actor(request),
                approval=approval,
                decision=decision,
                message="" if decision == "allow" else "denied from the admin",
            )
        except (PermissionRefused, RpcError, approvals.AlreadyDecided) as exc:
            refused.append(f"{approval.approval_id}: {exc}")
            continue
        done.append(f"{approval.approval_id}: {decision}")
    report_outcomes(modeladmin, request, done, refused)


@admin.action(description="Allow selected approvals (once)", permissions=["operate"])
def allow_approvals(modeladmin, request, queryset):
    _decide(modeladmin, request, queryset, "allow")


@admin.action(description="Deny selected approvals", permissions=["operate"])
def deny_approvals(modeladmin, request, queryset):
    _decide(modeladmin, request, queryset, "deny")


@admin.register(Approval)
class ApprovalAdmin(RoleAdmin):
    list_display = (
        "approval_id",
        "tool_name",
        "status",
        "decision",
        "decided_by",
        "run",
        "requested_at",
    )
    list_filter = ("status", "decision", "via")
    search_fields = ("approval_id", "tool_name", "run__run_id")
    actions = [allow_approvals, deny_approvals]


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(RoleAdmin):
    list_display = ("run", "default", "source", "updated_at")

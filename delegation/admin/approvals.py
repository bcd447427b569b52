"""Approvals in the admin (SPEC §11): read-only rows; allow or deny selected pending ones,
and edit a run's policy, through the one approvals service (role-checked and audited like
every other door)."""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin

from delegation import roles
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


class PolicyForm(forms.ModelForm):
    """The policy as one JSON document ``{rules, default}``, checked by the service's own
    strict schema; the reason goes into the audit entry."""

    policy = forms.JSONField(
        widget=forms.Textarea(attrs={"rows": 14, "cols": 90}),
        help_text='{"rules": [{"match": {"tool", "kind", "input"}, "decision"}], "default"}',
    )
    reason = forms.CharField(required=False, max_length=1000, help_text="Kept in the audit log.")

    class Meta:
        model = ApprovalPolicy
        fields = ("run",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["policy"].initial = self.instance.wire()

    def clean_policy(self):
        try:
            return approvals.check_policy(self.cleaned_data["policy"], "policy")
        except RpcError as exc:
            raise forms.ValidationError(exc.message) from None


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(RoleAdmin):
    """Viewers read; operators set a run's policy (replacing it) through
    ``do_set_policy``, which audits it and decides pending approvals it now decides."""

    form = PolicyForm
    list_display = ("run", "default", "source", "updated_at")
    search_fields = ("run__run_id",)
    raw_id_fields = ("run",)
    readonly_fields = ("current", "source", "updated_at")

    @admin.display(description="Policy in force")
    def current(self, obj):
        return json.dumps(obj.wire(), indent=2) if obj is not None and obj.pk else "-"

    def get_fields(self, request, obj=None):
        if not self.has_change_permission(request, obj):
            # Viewers read what is stored; the edit fields are the operator's.
            return ("run", *self.readonly_fields)
        return super().get_fields(request, obj)

    def has_add_permission(self, request):
        return roles.can_act(request.user)

    def has_change_permission(self, request, obj=None):
        return roles.can_act(request.user)

    def get_readonly_fields(self, request, obj=None):
        # A policy stays on its run; only its content changes.
        return (*self.readonly_fields, "run") if obj is not None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        run = obj.run
        approvals.do_set_policy(
            actor=admin_actor(request),
            run=run,
            policy=data["policy"],
            reason=data.get("reason") or "",
        )
        saved = ApprovalPolicy.objects.get(run=run)
        obj.pk, obj.rules, obj.default = saved.pk, saved.rules, saved.default
        obj.source, obj.updated_at = saved.source, saved.updated_at

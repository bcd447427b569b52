"""Runs and what hangs off them (sessions, events, budgets, rollups, steer receipts), with
the cancel, pause/resume, steer and budget actions."""

from __future__ import annotations

import uuid

from django import forms
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.template.response import TemplateResponse
from django.utils.html import format_html

from delegation.admin.base import RoleAdmin, admin_actor, report_outcomes
from delegation.errors import PermissionRefused, RpcError
from delegation.models import Budget, Event, Run, RunRollup, Session, SteerReceipt
from delegation.protocol import MAX_STEER_BYTES
from delegation.services.budgets import do_set_budget
from delegation.services.pause import do_pause_run, do_resume_run
from delegation.services.run_actions import do_cancel_run, do_steer_run
from delegation.wire import BudgetLimits, utf8_len


def _cancel(modeladmin, request, queryset, cascade: bool):
    done, refused = [], []
    for run in queryset:
        try:
            report = do_cancel_run(
                admin_actor(request), run, reason="cancelled from the admin", cascade=cascade
            )
        except (PermissionRefused, RpcError) as exc:
            refused.append(f"{run.run_id}: refused: {exc}")
            continue
        extra = f" (+{len(report['descendants'])} descendants)" if cascade else ""
        done.append(f"{run.run_id}: {report['outcome']}{extra}")
    report_outcomes(modeladmin, request, done, refused)


@admin.action(description="Cancel selected runs", permissions=["operate"])
def cancel_runs(modeladmin, request, queryset):
    _cancel(modeladmin, request, queryset, cascade=False)


@admin.action(description="Cancel selected runs and their whole subtrees", permissions=["operate"])
def cancel_subtrees(modeladmin, request, queryset):
    _cancel(modeladmin, request, queryset, cascade=True)


def _pause(modeladmin, request, queryset, action):
    # SPEC §14 through the one pause service REST and the run page use; each subtree whole.
    done, refused = [], []
    for run in queryset:
        try:
            report = action(admin_actor(request), run, reason="from the admin", subtree=True)
        except (PermissionRefused, RpcError) as exc:
            refused.append(f"{run.run_id}: refused: {exc}")
            continue
        done.append(f"{run.run_id}: {report['outcome']} (+{len(report['descendants'])} below)")
    report_outcomes(modeladmin, request, done, refused)


@admin.action(description="Pause selected runs and their subtrees", permissions=["operate"])
def pause_subtrees(modeladmin, request, queryset):
    _pause(modeladmin, request, queryset, do_pause_run)


@admin.action(description="Resume selected runs and their subtrees", permissions=["operate"])
def resume_subtrees(modeladmin, request, queryset):
    _pause(modeladmin, request, queryset, do_resume_run)


class SteerForm(forms.Form):
    message = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80}), max_length=MAX_STEER_BYTES
    )
    request_id = forms.CharField(widget=forms.HiddenInput, max_length=128)

    def clean_message(self):
        # max_length counts characters; the limit is bytes of UTF-8, as the service counts.
        message = self.cleaned_data["message"]
        if utf8_len(message) > MAX_STEER_BYTES:
            raise forms.ValidationError(f"At most {MAX_STEER_BYTES} bytes of UTF-8.")
        return message


@admin.action(description="Steer selected runs…", permissions=["operate"])
def steer_runs(modeladmin, request, queryset):
    """An intermediate form: the message, then one do_steer_run per selected run."""
    form = None
    if "apply" in request.POST:
        form = SteerForm(request.POST)
        if form.is_valid():
            done, refused = [], []
            for run in queryset:
                try:
                    answer = do_steer_run(
                        admin_actor(request),
                        run,
                        request_id=form.cleaned_data["request_id"],
                        message=form.cleaned_data["message"],
                    )
                except (PermissionRefused, RpcError) as exc:
                    refused.append(f"{run.run_id}: refused: {exc}")
                    continue
                reason = f" ({answer['reason']})" if answer.get("reason") else ""
                done.append(f"{run.run_id}: {answer['outcome']}{reason}")
            report_outcomes(modeladmin, request, done, refused)
            return None
    if form is None:
        form = SteerForm(initial={"request_id": f"admin-{uuid.uuid4().hex[:16]}"})
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": "Steer runs",
        "runs": queryset,
        "form": form,
        "opts": modeladmin.model._meta,
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
    }
    return TemplateResponse(request, "admin/delegation/run/steer.html", context)


class BudgetForm(forms.Form):
    maxRuns = forms.IntegerField(required=False, min_value=0, max_value=10**15)  # noqa: N815
    maxLive = forms.IntegerField(required=False, min_value=0, max_value=10**15)  # noqa: N815
    maxTokens = forms.IntegerField(required=False, min_value=0, max_value=10**15)  # noqa: N815
    maxCostUsd = forms.FloatField(required=False, min_value=0, max_value=1e9)  # noqa: N815
    maxSeconds = forms.IntegerField(required=False, min_value=1, max_value=10**12)  # noqa: N815
    # SPEC §14: at a limit, cancel the subtree or pause it and ask in the approvals inbox.
    onLimit = forms.ChoiceField(  # noqa: N815
        choices=[("cancel", "cancel the subtree"), ("pause", "pause it and ask")],
        initial="cancel",
        required=False,
    )
    reason = forms.CharField(required=False, max_length=500)


@admin.action(description="Set budget of selected runs…", permissions=["operate"])
def set_budgets(modeladmin, request, queryset):
    """An intermediate form: the limits, then one do_set_budget per selected run."""
    form = None
    if "apply" in request.POST:
        form = BudgetForm(request.POST)
        if form.is_valid():
            data = dict(form.cleaned_data)
            reason = data.pop("reason")
            limits = BudgetLimits.model_validate(
                {name: value for name, value in data.items() if value not in (None, "")}
            )
            done, refused = [], []
            for run in queryset:
                try:
                    do_set_budget(admin_actor(request), run, limits, replace=True, reason=reason)
                except (PermissionRefused, RpcError) as exc:
                    refused.append(f"{run.run_id}: refused: {exc}")
                    continue
                done.append(f"{run.run_id}: budget set")
            report_outcomes(modeladmin, request, done, refused)
            return None
    if form is None:
        form = BudgetForm()
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": "Set budget",
        "runs": queryset,
        "form": form,
        "opts": modeladmin.model._meta,
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
    }
    return TemplateResponse(request, "admin/delegation/run/budget.html", context)


def _status(obj):
    return format_html('<span class="canopy-status canopy-{}">{}</span>', obj.status, obj.status)


@admin.register(Run)
class RunAdmin(RoleAdmin):
    list_display = (
        "run_id",
        "status_chip",
        "depth",
        "profile",
        "runner",
        "parent_link",
        "last_sequence",
        "refused_spawns",
        "subtree_cost",
        "cancel_requested_at",
        "created_at",
        "finished_at",
    )
    list_filter = ("status", "depth", "runner", "profile", "via", "done", "cancelled")
    search_fields = (
        "run_id",
        "session__conversation_id",
        "parent__run_id",
        "root__run_id",
        "request_id",
    )
    list_select_related = ("runner", "parent", "session", "rollup")
    date_hierarchy = "created_at"
    actions = [
        cancel_runs,
        cancel_subtrees,
        pause_subtrees,
        resume_subtrees,
        steer_runs,
        set_budgets,
    ]
    readonly_fields = [f.name for f in Run._meta.fields]
    show_full_result_count = False

    @admin.display(description="status", ordering="status")
    def status_chip(self, obj):
        return _status(obj)

    @admin.display(description="subtree cost", ordering="rollup__sub_cost_nanos")
    def subtree_cost(self, obj):
        rollup = getattr(obj, "rollup", None)
        return f"${(rollup.sub_cost_nanos if rollup else 0) / 1e9:.4f}"

    @admin.display(description="parent", ordering="parent__run_id")
    def parent_link(self, obj):
        return obj.parent.run_id if obj.parent_id else "—"

    def view_on_site(self, obj):
        return f"/runs/{obj.run_id}/"


@admin.register(Budget)
class BudgetAdmin(RoleAdmin):
    """Budgets are set with the runs' "Set budget" action (audited); listed here with state."""

    list_display = (
        "run",
        "max_runs",
        "max_live",
        "max_tokens",
        "max_cost_usd",
        "max_seconds",
        "set_by",
        "warned_at",
        "exceeded_at",
        "exceeded_reason",
        "on_limit",
    )
    list_filter = ("exceeded_at", "on_limit")
    search_fields = ("run__run_id", "set_by", "exceeded_reason")
    list_select_related = ("run",)
    readonly_fields = [f.name for f in Budget._meta.fields]

    @admin.display(description="max cost (USD)", ordering="max_cost_nanos")
    def max_cost_usd(self, obj):
        return None if obj.max_cost_nanos is None else obj.max_cost_nanos / 1e9


@admin.register(RunRollup)
class RunRollupAdmin(RoleAdmin):
    """Each run's own usage and its subtree's, as the services keep them (read-only)."""

    list_display = (
        "run",
        "own_tokens_in",
        "own_tokens_out",
        "own_cost_nanos",
        "sub_tokens_in",
        "sub_tokens_out",
        "sub_cost_nanos",
        "sub_running",
        "sub_succeeded",
        "sub_failed",
        "sub_cancelled",
        "sub_lost",
        "updated_at",
    )
    list_filter = ("sub_running",)
    search_fields = ("run__run_id",)
    list_select_related = ("run",)
    readonly_fields = [f.name for f in RunRollup._meta.fields]


@admin.register(Session)
class SessionAdmin(RoleAdmin):
    list_display = ("conversation_id", "depth", "profile", "runner", "parent", "created_at")
    list_filter = ("depth", "runner", "profile")
    search_fields = ("conversation_id", "parent__conversation_id", "runs__run_id")
    list_select_related = ("runner", "parent")
    readonly_fields = [f.name for f in Session._meta.fields]


@admin.register(Event)
class EventAdmin(RoleAdmin):
    list_display = ("run", "sequence", "kind", "actor", "short_text", "success", "created_at")
    list_filter = ("kind", "run__status", "run__depth", "run__runner", "run__profile")
    search_fields = ("run__run_id", "tool_call_id", "actor")
    list_select_related = ("run",)
    readonly_fields = [f.name for f in Event._meta.fields]
    show_full_result_count = False

    @admin.display(description="text")
    def short_text(self, obj):
        text = obj.text or obj.error or ""
        return text[:80] + ("…" if len(text) > 80 else "")


@admin.register(SteerReceipt)
class SteerReceiptAdmin(RoleAdmin):
    list_display = (
        "request_id",
        "run",
        "outcome",
        "reason",
        "runner_outcome",
        "undelivered_at",
        "actor",
        "created_at",
    )
    list_filter = ("outcome", "run__runner", "run__depth", "run__profile")
    search_fields = ("request_id", "run__run_id", "session__conversation_id", "actor")
    readonly_fields = [f.name for f in SteerReceipt._meta.fields]

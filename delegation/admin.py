"""Django admin over the record, with the operator actions.

The records are read-only here (the runner protocol and the services write them); the
actions cancel, cancel subtree, steer (with its own form) and release lease call the same
service functions as the dashboard, the REST API and the runners, so they check the role and
write the audit entry the same way. Who may see what follows the Canopy roles: viewers read,
operators also act, admins also manage runners and API tokens.
"""

from __future__ import annotations

import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.template.response import TemplateResponse
from django.utils.html import format_html

from delegation import roles
from delegation.errors import PermissionRefused, RpcError
from delegation.models import (
    ALERT_KINDS,
    ApiToken,
    AuditEntry,
    Budget,
    Command,
    Event,
    ExtensionPreset,
    Lease,
    Run,
    Runner,
    RunRollup,
    RunToken,
    Session,
    SteerReceipt,
    Webhook,
    WebhookAttempt,
    WebhookDelivery,
)
from delegation.protocol import MAX_STEER_BYTES
from delegation.services import alerts
from delegation.services.budgets import do_set_budget
from delegation.services.operator import Actor, do_cancel_run, do_steer_run, release_lease
from delegation.wire import BudgetLimits, utf8_len


class RoleAdmin(admin.ModelAdmin):
    """Read-only for everyone with a Canopy role; actions need the operator role."""

    def has_module_permission(self, request):
        return roles.can_view(request.user)

    def has_view_permission(self, request, obj=None):
        return roles.can_view(request.user)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_operate_permission(self, request):
        return roles.can_act(request.user)


def _actor(request) -> Actor:
    return Actor.for_user(request.user, via="admin")


def _report(modeladmin, request, done: list[str], refused: list[str]):
    if done:
        modeladmin.message_user(request, "; ".join(done), messages.SUCCESS)
    if refused:
        modeladmin.message_user(request, "; ".join(refused), messages.ERROR)


def _cancel(modeladmin, request, queryset, cascade: bool):
    done, refused = [], []
    for run in queryset:
        try:
            report = do_cancel_run(
                _actor(request), run, reason="cancelled from the admin", cascade=cascade
            )
        except (PermissionRefused, RpcError) as exc:
            refused.append(f"{run.run_id}: refused: {exc}")
            continue
        extra = f" (+{len(report['descendants'])} descendants)" if cascade else ""
        done.append(f"{run.run_id}: {report['outcome']}{extra}")
    _report(modeladmin, request, done, refused)


@admin.action(description="Cancel selected runs", permissions=["operate"])
def cancel_runs(modeladmin, request, queryset):
    _cancel(modeladmin, request, queryset, cascade=False)


@admin.action(description="Cancel selected runs and their whole subtrees", permissions=["operate"])
def cancel_subtrees(modeladmin, request, queryset):
    _cancel(modeladmin, request, queryset, cascade=True)


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
                        _actor(request),
                        run,
                        request_id=form.cleaned_data["request_id"],
                        message=form.cleaned_data["message"],
                    )
                except (PermissionRefused, RpcError) as exc:
                    refused.append(f"{run.run_id}: refused: {exc}")
                    continue
                reason = f" ({answer['reason']})" if answer.get("reason") else ""
                done.append(f"{run.run_id}: {answer['outcome']}{reason}")
            _report(modeladmin, request, done, refused)
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


@admin.action(description="Release selected leases", permissions=["operate"])
def release_leases(modeladmin, request, queryset):
    done, refused = [], []
    for lease in queryset:
        try:
            report = release_lease(_actor(request), lease)
        except (PermissionRefused, RpcError) as exc:
            refused.append(f"{lease.lease_id}: refused: {exc}")
            continue
        pending = (
            f", {len(report['pending'])} child(ren) still stopping" if report["pending"] else ""
        )
        done.append(f"{lease.lease_id}: {report['state']}{pending}")
    _report(modeladmin, request, done, refused)


class BudgetForm(forms.Form):
    maxRuns = forms.IntegerField(required=False, min_value=0, max_value=10**15)  # noqa: N815
    maxLive = forms.IntegerField(required=False, min_value=0, max_value=10**15)  # noqa: N815
    maxTokens = forms.IntegerField(required=False, min_value=0, max_value=10**15)  # noqa: N815
    maxCostUsd = forms.FloatField(required=False, min_value=0, max_value=1e9)  # noqa: N815
    maxSeconds = forms.IntegerField(required=False, min_value=1, max_value=10**12)  # noqa: N815
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
                {name: value for name, value in data.items() if value is not None}
            )
            done, refused = [], []
            for run in queryset:
                try:
                    do_set_budget(_actor(request), run, limits, replace=True, reason=reason)
                except (PermissionRefused, RpcError) as exc:
                    refused.append(f"{run.run_id}: refused: {exc}")
                    continue
                done.append(f"{run.run_id}: budget set")
            _report(modeladmin, request, done, refused)
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
    actions = [cancel_runs, cancel_subtrees, steer_runs, set_budgets]
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
    )
    list_filter = ("exceeded_at",)
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


@admin.register(Lease)
class LeaseAdmin(RoleAdmin):
    list_display = (
        "lease_id",
        "runner",
        "state",
        "extension_id",
        "generation",
        "parent_run",
        "created_at",
        "expires_at",
        "ended_at",
    )
    list_filter = ("state", "runner", "extension_id", "parent_run__depth", "parent_run__profile")
    search_fields = ("lease_id", "parent_run__run_id", "runner__name")
    list_select_related = ("runner", "parent_run")
    actions = [release_leases]
    readonly_fields = [f.name for f in Lease._meta.fields]


class PresetInline(admin.TabularInline):
    model = ExtensionPreset
    extra = 0
    fields = ("extension_id", "generation", "name", "options", "registered_at")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return roles.can_view(request.user)


@admin.register(Runner)
class RunnerAdmin(RoleAdmin):
    list_display = (
        "name",
        "connected",
        "connection_generation",
        "host_instance_id",
        "last_seen_at",
        "lost_at",
        "revoked_at",
        "token_prefix",
    )
    list_filter = ("connected",)
    search_fields = ("name", "host_instance_id")
    inlines = [PresetInline]
    exclude = ("token_hash",)
    readonly_fields = [f.name for f in Runner._meta.fields if f.name != "token_hash"]


@admin.register(ExtensionPreset)
class ExtensionPresetAdmin(RoleAdmin):
    list_display = ("name", "extension_id", "generation", "runner", "registered_at")
    list_filter = ("runner", "extension_id", "name")
    search_fields = ("name", "extension_id", "runner__name")
    readonly_fields = [f.name for f in ExtensionPreset._meta.fields]


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


@admin.register(Command)
class CommandAdmin(RoleAdmin):
    list_display = ("rpc_label", "method", "runner", "run", "attempts", "sent_at", "answered_at")
    list_filter = ("method", "runner", "run__status", "run__depth", "run__profile")
    search_fields = ("run__run_id", "runner__name")
    readonly_fields = [f.name for f in Command._meta.fields]

    @admin.display(description="id")
    def rpc_label(self, obj):
        return obj.rpc_id


@admin.register(AuditEntry)
class AuditEntryAdmin(RoleAdmin):
    list_display = ("created_at", "actor", "via", "action", "target_type", "target_id", "outcome")
    list_filter = ("action", "via", "target_type", "outcome")
    search_fields = ("actor", "target_id", "reason")
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in AuditEntry._meta.fields]


@admin.register(ApiToken)
class ApiTokenAdmin(RoleAdmin):
    list_display = ("user", "name", "token_prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("user__username", "name", "token_prefix")
    exclude = ("token_hash",)
    readonly_fields = [f.name for f in ApiToken._meta.fields if f.name != "token_hash"]

    def has_module_permission(self, request):
        return roles.can_admin(request.user)

    def has_view_permission(self, request, obj=None):
        return roles.can_admin(request.user)


# --- Admin-only records: run tokens, webhooks and their deliveries ---------------------------


class AdminOnly(RoleAdmin):
    def has_module_permission(self, request):
        return roles.can_admin(request.user)

    def has_view_permission(self, request, obj=None):
        return roles.can_admin(request.user)


def _field_error(exc: RpcError) -> forms.ValidationError:
    # The services name the field ("url: ..."); the form shows the message under that field.
    return forms.ValidationError(exc.message.partition(": ")[2] or exc.message)


@admin.register(RunToken)
class RunTokenAdmin(AdminOnly):
    """Run tokens for /mcp: which run, when issued and until when; never the secret."""

    list_display = ("run", "token_prefix", "created_at", "expires_at")
    search_fields = ("run__run_id", "token_prefix")
    list_select_related = ("run",)
    exclude = ("token_hash", "runner_token_hash")
    readonly_fields = [
        f.name for f in RunToken._meta.fields if f.name not in ("token_hash", "runner_token_hash")
    ]


class WebhookForm(forms.ModelForm):
    kinds = forms.MultipleChoiceField(
        choices=[(kind, kind) for kind in ALERT_KINDS], widget=forms.CheckboxSelectMultiple
    )
    new_secret = forms.CharField(
        required=False,
        label="Secret",
        widget=forms.PasswordInput(render_value=False),
        help_text=(
            f"At least {alerts.MIN_SECRET_CHARS} characters. Leave empty to have one made "
            "(new webhook) or to keep the current one (existing webhook)."
        ),
    )

    class Meta:
        model = Webhook
        fields = ("name", "url", "kinds", "active")

    def clean_url(self):
        try:
            return alerts.check_url(self.cleaned_data["url"])
        except RpcError as exc:
            raise _field_error(exc) from None

    def clean_new_secret(self):
        secret = self.cleaned_data.get("new_secret") or ""
        if secret:
            try:
                alerts.check_secret(secret)
            except RpcError as exc:
                raise _field_error(exc) from None
        return secret


@admin.action(description="Send a test delivery to the selected webhooks", permissions=["admin"])
def send_test(modeladmin, request, queryset):
    done, refused = [], []
    for hook in queryset:
        try:
            delivery = alerts.do_send_test(_actor(request), hook)
        except PermissionRefused as exc:
            refused.append(f"{hook}: refused: {exc}")
            continue
        done.append(f"{hook}: test delivery {delivery.delivery_id} queued")
    _report(modeladmin, request, done, refused)


@admin.register(Webhook)
class WebhookAdmin(AdminOnly):
    """Configured here, through the same services as REST (checked and audited there)."""

    form = WebhookForm
    list_display = ("__str__", "url", "kinds", "active", "created_by", "created_at")
    list_filter = ("active",)
    search_fields = ("name", "url")
    actions = [send_test]

    def has_add_permission(self, request):
        return roles.can_admin(request.user)

    def has_change_permission(self, request, obj=None):
        return roles.can_admin(request.user)

    def has_delete_permission(self, request, obj=None):
        return roles.can_admin(request.user)

    def has_admin_permission(self, request):
        return roles.can_admin(request.user)

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        fields = {
            "url": data["url"],
            "kinds": data["kinds"],
            "active": data["active"],
            "name": data.get("name") or "",
            "secret": data.get("new_secret") or None,
        }
        if change:
            hook = alerts.do_update_webhook(_actor(request), obj, **fields)
        else:
            created = alerts.do_create_webhook(_actor(request), **fields)
            hook = created.webhook
            if not data.get("new_secret"):
                self.message_user(
                    request,
                    f"Secret of {hook}: {created.secret} — give it to the receiver now; "
                    "it is not shown again.",
                    messages.WARNING,
                )
        obj.pk = hook.pk
        obj.secret = hook.secret
        obj.created_at = hook.created_at
        obj.created_by = hook.created_by

    def delete_model(self, request, obj):
        alerts.do_delete_webhook(_actor(request), obj)

    def delete_queryset(self, request, queryset):
        for hook in queryset:
            alerts.do_delete_webhook(_actor(request), hook)


class AttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    fields = ("number", "started_at", "duration_ms", "status_code", "error")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return roles.can_admin(request.user)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(AdminOnly):
    list_display = (
        "delivery_id",
        "kind",
        "webhook",
        "state",
        "attempts",
        "last_status",
        "created_at",
        "next_attempt_at",
        "delivered_at",
    )
    list_filter = ("state", "kind", "webhook")
    search_fields = ("delivery_id", "webhook__url", "webhook__name")
    list_select_related = ("webhook",)
    inlines = [AttemptInline]
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]
    date_hierarchy = "created_at"


@admin.register(WebhookAttempt)
class WebhookAttemptAdmin(AdminOnly):
    list_display = ("delivery", "number", "started_at", "duration_ms", "status_code", "error")
    list_filter = ("status_code", "delivery__webhook", "delivery__kind")
    search_fields = ("delivery__delivery_id", "error")
    list_select_related = ("delivery",)
    readonly_fields = [f.name for f in WebhookAttempt._meta.fields]


admin.site.site_header = "Canopy admin"
admin.site.site_title = "Canopy admin"
admin.site.index_title = "The record"

"""Webhooks, their deliveries and attempts (admins only)."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages

from delegation import roles
from delegation.admin.base import AdminOnly, ReadOnlyInline, admin_actor, report_outcomes
from delegation.errors import PermissionRefused, RpcError
from delegation.models import ALERT_KINDS, Webhook, WebhookAttempt, WebhookDelivery
from delegation.services import webhooks


def _field_error(exc: RpcError) -> forms.ValidationError:
    # The services name the field ("url: ..."); the form shows the message under that field.
    return forms.ValidationError(exc.message.partition(": ")[2] or exc.message)


class WebhookForm(forms.ModelForm):
    kinds = forms.MultipleChoiceField(
        choices=[(kind, kind) for kind in ALERT_KINDS], widget=forms.CheckboxSelectMultiple
    )
    new_secret = forms.CharField(
        required=False,
        label="Secret",
        widget=forms.PasswordInput(render_value=False),
        help_text=(
            f"At least {webhooks.MIN_SECRET_CHARS} characters. Leave empty to have one made "
            "(new webhook) or to keep the current one (existing webhook)."
        ),
    )

    class Meta:
        model = Webhook
        fields = ("name", "url", "kinds", "active")

    def clean_url(self):
        try:
            return webhooks.check_url(self.cleaned_data["url"])
        except RpcError as exc:
            raise _field_error(exc) from None

    def clean_new_secret(self):
        secret = self.cleaned_data.get("new_secret") or ""
        if secret:
            try:
                webhooks.check_secret(secret)
            except RpcError as exc:
                raise _field_error(exc) from None
        return secret


@admin.action(description="Send a test delivery to the selected webhooks", permissions=["admin"])
def send_test(modeladmin, request, queryset):
    done, refused = [], []
    for hook in queryset:
        try:
            delivery = webhooks.do_send_test(admin_actor(request), hook)
        except PermissionRefused as exc:
            refused.append(f"{hook}: refused: {exc}")
            continue
        done.append(f"{hook}: test delivery {delivery.delivery_id} queued")
    report_outcomes(modeladmin, request, done, refused)


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
            hook = webhooks.do_update_webhook(admin_actor(request), obj, **fields)
        else:
            created = webhooks.do_create_webhook(admin_actor(request), **fields)
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
        webhooks.do_delete_webhook(admin_actor(request), obj)

    def delete_queryset(self, request, queryset):
        for hook in queryset:
            webhooks.do_delete_webhook(admin_actor(request), hook)


class AttemptInline(ReadOnlyInline):
    model = WebhookAttempt
    fields = ("number", "started_at", "duration_ms", "status_code", "error")
    readonly_fields = fields

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

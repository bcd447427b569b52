"""Who may act: the audit log, API tokens and run tokens (never their secrets)."""

from __future__ import annotations

from django.contrib import admin

from delegation import roles
from delegation.admin.base import AdminOnly, RoleAdmin
from delegation.models import ApiToken, AuditEntry, RunToken


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

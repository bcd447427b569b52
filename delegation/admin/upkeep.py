"""What the upkeep loop keeps: the trace export queue, retention passes and the tombstones of
purged runs, and the identities single sign-on matched. Read-only: the loop writes them."""

from __future__ import annotations

from django.contrib import admin

from delegation.admin.base import AdminOnly, RoleAdmin
from delegation.models import PurgedRun, RetentionPass, SsoIdentity, TraceExport


def _read_only(model) -> list[str]:
    return [f.name for f in model._meta.fields]


@admin.register(TraceExport)
class TraceExportAdmin(RoleAdmin):
    list_display = ("run", "final", "sent", "attempts", "queued_at", "next_attempt_at", "sent_at")
    list_filter = ("sent", "final")
    search_fields = ("run__run_id",)
    list_select_related = ("run",)
    readonly_fields = _read_only(TraceExport)


@admin.register(RetentionPass)
class RetentionPassAdmin(AdminOnly):
    list_display = (
        "started_at",
        "finished_at",
        "events_deleted",
        "runs_deleted",
        "trees_deleted",
        "audit_deleted",
        "batches",
    )
    date_hierarchy = "started_at"
    readonly_fields = _read_only(RetentionPass)


@admin.register(PurgedRun)
class PurgedRunAdmin(RoleAdmin):
    list_display = ("run_id", "root_run_id", "finished_at", "purged_at")
    search_fields = ("run_id", "root_run_id")
    readonly_fields = _read_only(PurgedRun)


@admin.register(SsoIdentity)
class SsoIdentityAdmin(AdminOnly):
    list_display = ("user", "issuer", "subject", "role", "created_at", "last_seen_at")
    list_filter = ("role", "issuer")
    search_fields = ("user__username", "subject")
    readonly_fields = _read_only(SsoIdentity)

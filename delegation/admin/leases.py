"""Leases and the release action."""

from __future__ import annotations

from django.contrib import admin

from delegation.admin.base import RoleAdmin, admin_actor, report_outcomes
from delegation.errors import PermissionRefused, RpcError
from delegation.models import Lease
from delegation.services.run_actions import release_lease


@admin.action(description="Release selected leases", permissions=["operate"])
def release_leases(modeladmin, request, queryset):
    done, refused = [], []
    for lease in queryset:
        try:
            report = release_lease(admin_actor(request), lease)
        except (PermissionRefused, RpcError) as exc:
            refused.append(f"{lease.lease_id}: refused: {exc}")
            continue
        pending = (
            f", {len(report['pending'])} child(ren) still stopping" if report["pending"] else ""
        )
        done.append(f"{lease.lease_id}: {report['state']}{pending}")
    report_outcomes(modeladmin, request, done, refused)


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

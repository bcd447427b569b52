"""The admin's shared parts: role-checked read-only model admins and action reports."""

from __future__ import annotations

from django.contrib import admin, messages

from delegation import roles
from delegation.services.run_actions import Actor


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


def admin_actor(request) -> Actor:
    return Actor.for_user(request.user, via="admin")


def report_outcomes(modeladmin, request, done: list[str], refused: list[str]):
    if done:
        modeladmin.message_user(request, "; ".join(done), messages.SUCCESS)
    if refused:
        modeladmin.message_user(request, "; ".join(refused), messages.ERROR)


class AdminOnly(RoleAdmin):
    def has_module_permission(self, request):
        return roles.can_admin(request.user)

    def has_view_permission(self, request, obj=None):
        return roles.can_admin(request.user)


class ReadOnlyInline(admin.TabularInline):
    """A record's rows shown under it, never edited here."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return roles.can_view(request.user)

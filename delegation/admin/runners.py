"""Runners, their presets and the commands sent to them."""

from __future__ import annotations

from django.contrib import admin

from delegation.admin.base import ReadOnlyInline, RoleAdmin
from delegation.models import Command, ExtensionPreset, Runner


class PresetInline(ReadOnlyInline):
    model = ExtensionPreset
    fields = ("extension_id", "generation", "name", "options", "registered_at")
    readonly_fields = fields


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


@admin.register(Command)
class CommandAdmin(RoleAdmin):
    list_display = ("rpc_label", "method", "runner", "run", "attempts", "sent_at", "answered_at")
    list_filter = ("method", "runner", "run__status", "run__depth", "run__profile")
    search_fields = ("run__run_id", "runner__name")
    readonly_fields = [f.name for f in Command._meta.fields]

    @admin.display(description="id")
    def rpc_label(self, obj):
        return obj.rpc_id

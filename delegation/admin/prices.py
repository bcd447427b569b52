"""The price table (admins edit it; every change goes through the service, audited)."""

from __future__ import annotations

from django.contrib import admin

from delegation import roles
from delegation.admin.base import AdminOnly, admin_actor
from delegation.models import ModelPrice
from delegation.services import prices


@admin.register(ModelPrice)
class ModelPriceAdmin(AdminOnly, admin.ModelAdmin):
    list_display = (
        "model",
        "input_per_mtok",
        "output_per_mtok",
        "cache_read_per_mtok",
        "cache_write_per_mtok",
        "updated_by",
        "updated_at",
    )
    search_fields = ("model",)
    fields = (
        "model",
        "input_per_mtok",
        "output_per_mtok",
        "cache_read_per_mtok",
        "cache_write_per_mtok",
        "note",
    )

    def has_module_permission(self, request):
        return roles.can_view(request.user)  # everyone with a role may read the prices

    def has_view_permission(self, request, obj=None):
        return roles.can_view(request.user)

    def has_add_permission(self, request):
        return roles.can_admin(request.user)

    def has_change_permission(self, request, obj=None):
        return roles.can_admin(request.user)

    def has_delete_permission(self, request, obj=None):
        return roles.can_admin(request.user)

    def save_model(self, request, obj, form, change):
        # The service checks the role, validates and audits; the form only collects.
        values = {name: getattr(obj, column) for name, column in prices.PRICE_FIELDS.items()}
        if change and "model" in form.changed_data:
            prices.do_delete_price(admin_actor(request), model=form.initial["model"])
        saved = prices.do_set_price(
            admin_actor(request), model=obj.model, prices=values, note=obj.note
        )
        obj.pk = saved.pk

    def delete_model(self, request, obj):
        prices.do_delete_price(admin_actor(request), model=obj.model)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            prices.do_delete_price(admin_actor(request), model=obj.model)

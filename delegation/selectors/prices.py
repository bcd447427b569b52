"""Reads of the price table (SPEC §10)."""

from __future__ import annotations

from delegation.models import ModelPrice


def price_table() -> list[ModelPrice]:
    """Every priced model, by name."""
    return list(ModelPrice.objects.order_by("model"))

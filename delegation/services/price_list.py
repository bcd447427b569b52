"""The list prices Canopy ships in its price table (``0009_model_prices`` loads them)."""

from __future__ import annotations

from decimal import Decimal

# List prices (USD per million tokens: input, output, cache read, cache write) of the models
# the README presets run by default, as published by each vendor when this was written.
# Admins keep them current (admin, REST); a price is looked up by exact model name, then by
# the longest name that is a prefix of it ("claude-sonnet-4-5" prices
# "claude-sonnet-4-5-20250929"). Copilot CLI names Claude models with dots.
SHIPPED = [
    ("claude-opus-4-5", "5", "25", "0.50", "6.25"),
    ("claude-opus-4.5", "5", "25", "0.50", "6.25"),
    ("claude-opus-4-1", "15", "75", "1.50", "18.75"),
    ("claude-opus-4", "15", "75", "1.50", "18.75"),
    ("claude-sonnet-4-5", "3", "15", "0.30", "3.75"),
    ("claude-sonnet-4.5", "3", "15", "0.30", "3.75"),
    ("claude-sonnet-4", "3", "15", "0.30", "3.75"),
    ("claude-haiku-4-5", "1", "5", "0.10", "1.25"),
    ("claude-haiku-4.5", "1", "5", "0.10", "1.25"),
    ("claude-3-5-haiku", "0.80", "4", "0.08", "1"),
    ("gpt-5", "1.25", "10", "0.125", "0"),
    ("gpt-5-codex", "1.25", "10", "0.125", "0"),
    ("gpt-5.1", "1.25", "10", "0.125", "0"),
    ("gpt-5.1-codex", "1.25", "10", "0.125", "0"),
    ("gpt-5.1-codex-mini", "0.25", "2", "0.025", "0"),
    ("gpt-5-mini", "0.25", "2", "0.025", "0"),
    ("gpt-4.1", "2", "8", "0.50", "0"),
    ("gemini-2.5-pro", "1.25", "10", "0.125", "0"),
    ("gemini-2.5-flash", "0.30", "2.50", "0.03", "0"),
    ("gemini-2.5-flash-lite", "0.10", "0.40", "0.01", "0"),
    ("gemini-3-pro-preview", "2", "12", "0.20", "0"),
]


def ship(model_price) -> int:
    """Add each shipped price the table lacks (an admin's own figures are kept); returns how
    many were added. ``model_price``: the model class (the migration passes its historical
    one)."""
    added = 0
    for model, inp, out, read, write in SHIPPED:
        _price, created = model_price.objects.get_or_create(
            model=model,
            defaults={
                "input_per_mtok": Decimal(inp),
                "output_per_mtok": Decimal(out),
                "cache_read_per_mtok": Decimal(read),
                "cache_write_per_mtok": Decimal(write),
                "note": "list price shipped with Canopy",
                "updated_by": "migration",
            },
        )
        added += created
    return added

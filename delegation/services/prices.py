"""The price table (SPEC §10): what a usage event without the agent's own cost costs.

An agent that reports tokens and a model but no dollars (Codex, Copilot CLI, a self-hosted
model) is priced here when its usage event is stored: ``price_rows`` sets the stored event's
``costUsd`` from the model's price and marks ``costSource`` ``table``; an event that carried
its own cost is marked ``agent``. An event with tokens whose model has no price (or that names
no model) is marked ``unpriced`` and counted as such in the rollups: views say the cost is
incomplete and a cost budget says it cannot bound it, instead of showing $0.

Prices are read when the event is stored and never applied again: editing a price changes
new events only, and stored costs (and the rollups summed from them) stay as they were.
A model's price is its exact name's, else the longest priced name that is a prefix of it.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.utils import timezone

from delegation import roles
from delegation.errors import INVALID_PARAMS, PermissionRefused, RpcError
from delegation.models import ModelPrice
from delegation.services.audit import audit
from delegation.services.identity import Actor

PRICE_FIELDS = {
    "inputPerMTok": "input_per_mtok",
    "outputPerMTok": "output_per_mtok",
    "cacheReadPerMTok": "cache_read_per_mtok",
    "cacheWritePerMTok": "cache_write_per_mtok",
}
MAX_PRICE = Decimal("100000")
AGENT, TABLE, UNPRICED = "agent", "table", "unpriced"


def lookup(model: str | None, table: dict[str, ModelPrice]) -> ModelPrice | None:
    if not model:
        return None
    if model in table:
        return table[model]
    best = None
    for name, price in table.items():
        if model.startswith(name) and (best is None or len(name) > len(best.model)):
            best = price
    return best


def cost_usd(usage, price: ModelPrice) -> float:
    per_token = (
        usage.input_tokens * price.input_per_mtok
        + usage.output_tokens * price.output_per_mtok
        + usage.cache_read_tokens * price.cache_read_per_mtok
        + usage.cache_write_tokens * price.cache_write_per_mtok
    )
    return float(per_token / Decimal(1_000_000))


def price_rows(rows: list[dict], usages: dict) -> dict:
    """Price the usage events among ``rows`` (the rows to store, by index in ``usages``):
    each stored input gains ``costSource`` (and ``costUsd`` from the table). Returns the
    usages to add to the rollups, each with its cost, and ``unpriced`` flags by index."""
    needs_table = [i for i, u in usages.items() if "cost_usd" not in u.model_fields_set]
    table = {p.model: p for p in ModelPrice.objects.all()} if needs_table else {}
    priced = {}
    for index, usage in usages.items():
        stored = dict(rows[index]["input"] or {})
        if index not in needs_table:
            stored["costSource"] = AGENT
            priced[index] = (usage, False)
        else:
            price = lookup(usage.model, table)
            tokens = (
                usage.input_tokens
                + usage.output_tokens
                + usage.cache_read_tokens
                + usage.cache_write_tokens
            )
            if price is not None:
                cost = cost_usd(usage, price)
                stored["costUsd"] = cost
                stored["costSource"] = TABLE
                usage = usage.model_copy(update={"cost_usd": cost})
                priced[index] = (usage, False)
            else:
                stored["costSource"] = UNPRICED if tokens else TABLE
                priced[index] = (usage, bool(tokens))
        rows[index]["input"] = stored
    return priced


def as_received(stored_input):
    """A stored usage input as the runner sent it (for comparing replays): without what the
    server added when pricing it."""
    if not isinstance(stored_input, dict) or "costSource" not in stored_input:
        return stored_input
    out = dict(stored_input)
    source = out.pop("costSource")
    if source == TABLE:
        out.pop("costUsd", None)
    return out


# --- the table, edited by admins ------------------------------------------------------------


def require_admin(actor: Actor, action: str, model: str) -> None:
    if actor.user is not None and roles.can_admin(actor.user):
        return
    with transaction.atomic():  # the refusal survives the caller's rollback
        audit(actor, action, "model-price", model, "refused: not an admin")
    role = roles.role_of(actor.user) if actor.user is not None else None
    raise PermissionRefused(f"{actor.label} has role {role or 'none'}; {action} needs admin")


# A model name: no control characters, no space at either end. Written so that Python and a
# JSON Schema (ECMA) regex agree on it: the REST path parameter publishes the same pattern.
_END = r"[^\s\ufeff\x00-\x1f\x7f-\x9f]"
MODEL_PATTERN = rf"^{_END}(?:[^\x00-\x1f\x7f-\x9f]*{_END})?$"
MODEL_MAX_LENGTH = 200


def check_model(model) -> str:
    if not isinstance(model, str) or not model.strip() or len(model) > MODEL_MAX_LENGTH:
        raise RpcError(INVALID_PARAMS, "model: must be a non-blank name of at most 200 chars")
    if not re.fullmatch(MODEL_PATTERN, model):
        raise RpcError(
            INVALID_PARAMS, "model: must not start or end with spaces or hold control characters"
        )
    return model


def check_prices(values: dict) -> dict:
    """``{inputPerMTok, outputPerMTok, cacheReadPerMTok?, cacheWritePerMTok?}`` → columns."""
    out = {}
    for name, column in PRICE_FIELDS.items():
        if name not in values or values[name] is None:
            if name in ("inputPerMTok", "outputPerMTok"):
                raise RpcError(INVALID_PARAMS, f"{name}: required")
            out[column] = Decimal(0)
            continue
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
            raise RpcError(INVALID_PARAMS, f"{name}: must be a number")
        try:
            amount = Decimal(str(value))
        except InvalidOperation:
            raise RpcError(INVALID_PARAMS, f"{name}: must be a number") from None
        if not amount.is_finite() or amount < 0 or amount > MAX_PRICE:
            raise RpcError(INVALID_PARAMS, f"{name}: must be between 0 and {MAX_PRICE}")
        out[column] = amount.quantize(Decimal("0.000001"))
    return out


def do_set_price(actor: Actor, *, model: str, prices: dict, note: str = "") -> ModelPrice:
    """Create or replace ``model``'s price (admins; audited with the old and new figures)."""
    model = check_model(model)
    require_admin(actor, "price-set", model)
    columns = check_prices(prices)
    with transaction.atomic():
        old = ModelPrice.objects.select_for_update().filter(model=model).first()
        before = price_item(old) if old else None
        price, _ = ModelPrice.objects.update_or_create(
            model=model,
            defaults={
                **columns,
                "note": (note or "")[:200],
                "updated_by": actor.label,
                "updated_at": timezone.now(),
            },
        )
        audit(
            actor,
            "price-set",
            "model-price",
            model,
            "updated" if old else "created",
            detail={"before": before, "after": price_item(price)},
        )
    return price


def do_delete_price(actor: Actor, *, model: str) -> bool:
    require_admin(actor, "price-delete", model)
    with transaction.atomic():
        old = ModelPrice.objects.filter(model=model).first()
        deleted, _ = ModelPrice.objects.filter(model=model).delete()
        audit(
            actor,
            "price-delete",
            "model-price",
            model,
            "deleted" if deleted else "not-found",
            detail={"before": price_item(old) if old else None},
        )
    return bool(deleted)


def price_item(price: ModelPrice) -> dict:
    return {
        "model": price.model,
        **{name: float(getattr(price, column)) for name, column in PRICE_FIELDS.items()},
        "note": price.note,
        "updatedBy": price.updated_by,
        "updatedAt": price.updated_at.isoformat(),
    }

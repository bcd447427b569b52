"""The price table (SPEC §10): per-model list prices used when an agent reports no cost.

Everyone with a role reads it; admins set and delete prices (audited). A price applies to
usage events stored after it was set: stored costs are never rewritten."""

from django.http import Http404
from ninja import Path, Router, Schema, Status
from pydantic import Field

from dashboard.api.core import ErrorOut, NoParams, actor_for, strict_query
from delegation.selectors.prices import price_table
from delegation.services import prices

router = Router(tags=["prices"])

READ = {401: ErrorOut, 403: ErrorOut, 422: ErrorOut}
ACT = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut}
PER_MTOK = "USD per million tokens"
MODEL = Path(
    ...,
    max_length=prices.MODEL_MAX_LENGTH,
    pattern=prices.MODEL_PATTERN,
    description="The model's exact name, as agents report it",
)


class PriceItem(Schema):
    model: str
    inputPerMTok: float = Field(description=PER_MTOK)
    outputPerMTok: float = Field(description=PER_MTOK)
    cacheReadPerMTok: float = Field(description=PER_MTOK)
    cacheWritePerMTok: float = Field(description=PER_MTOK)
    note: str
    updatedBy: str
    updatedAt: str


class PriceList(Schema):
    items: list[PriceItem]
    next: str | None = None


class PriceBody(Schema):
    inputPerMTok: float = Field(ge=0, le=100000, description=PER_MTOK)
    outputPerMTok: float = Field(ge=0, le=100000, description=PER_MTOK)
    cacheReadPerMTok: float = Field(default=0, ge=0, le=100000, description=PER_MTOK)
    cacheWritePerMTok: float = Field(default=0, ge=0, le=100000, description=PER_MTOK)
    note: str = Field(default="", max_length=200)

    # Strict like every other body: `false` or "4" is not a price (schemathesis found `false`
    # accepted as 0).
    model_config = {"extra": "forbid", "strict": True}


@router.get(
    "/prices",
    response={200: PriceList, **READ},
    summary="The price table: every priced model, by name",
    description="A model is priced by its exact name, else by the longest priced name that "
    "is a prefix of it. Usage events that carry no cost are priced from this table when "
    "stored (`costSource: table`).",
)
@strict_query(NoParams)
def list_prices(request):
    return {"items": [prices.price_item(p) for p in price_table()]}


@router.put(
    "/prices/{model}",
    response={200: PriceItem, **ACT},
    summary="Set a model's price (admin, audited; new usage events only)",
)
@strict_query(NoParams)
def set_price(request, body: PriceBody, model: str = MODEL):
    values = body.model_dump()
    note = values.pop("note")
    price = prices.do_set_price(actor_for(request), model=model, prices=values, note=note)
    return prices.price_item(price)


@router.delete(
    "/prices/{model}",
    response={204: None, **ACT},
    summary="Delete a model's price (admin, audited)",
)
@strict_query(NoParams)
def delete_price(request, model: str = MODEL):
    if not prices.do_delete_price(actor_for(request), model=model):
        raise Http404(f"model: no price for {model!r}")
    return Status(204, None)

"""The price table (SPEC §10): usage without the agent's own cost is priced from the table
when stored (``costSource``), editing a price changes new events only, an unknown model is
unpriced (never $0) and a cost budget says it cannot bound it; admins edit it (REST, admin),
audited. Over the real runner socket and the real REST API."""

import json

import pytest
from django.test import Client

from delegation.models import AuditEntry, Event, ModelPrice, RunRollup
from delegation.selectors import usage_of_run
from delegation.services import rollups
from tests.support.personas import api_token
from tests.support.rpc import adb

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("shipped_prices")]


def usage(tokens_in, tokens_out, **extra) -> dict:
    return {
        "kind": "usage",
        "input": {"inputTokens": tokens_in, "outputTokens": tokens_out, **extra},
    }


def put_price(token, model, body):
    return Client().put(
        f"/api/prices/{model}",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


async def stored(run_id):
    return await adb(
        lambda: [
            e.input
            for e in Event.objects.filter(run__run_id=run_id, kind="usage").order_by("sequence")
        ]
    )()


async def test_it_prices_usage_without_cost_from_the_table_and_only_new_events(runner, admin):
    await runner.open("root-1")
    # The shipped price of claude-sonnet-4-5 (3 / 15 / 0.30 / 3.75 per MTok) prices a dated name.
    await runner.emit(
        "root-1",
        [
            usage(1_000_000, 100_000, cacheReadTokens=10_000, model="claude-sonnet-4-5-20250929"),
            usage(10, 10, model="gpt-5-codex", costUsd=0.5),  # the agent's own cost stands
        ],
    )
    first, own = await stored("root-1")
    assert first["costSource"] == "table" and first["costUsd"] == pytest.approx(3 + 1.5 + 0.003)
    assert own["costSource"] == "agent" and own["costUsd"] == 0.5
    token = await adb(api_token)(admin)
    answer = await adb(put_price)(
        token, "claude-sonnet-4-5", {"inputPerMTok": 30, "outputPerMTok": 150}
    )
    assert answer.status_code == 200, answer.content
    await runner.emit("root-1", [usage(1_000_000, 0, model="claude-sonnet-4-5")], start=3)
    first_again, _own, new = await stored("root-1")
    assert first_again == first  # the stored cost was not rewritten
    assert new["costUsd"] == pytest.approx(30.0) and new["costSource"] == "table"
    rollup = await adb(lambda: RunRollup.objects.get(run__run_id="root-1"))()
    assert rollup.own_cost_nanos == rollups.cost_nanos(4.503) + rollups.cost_nanos(
        0.5
    ) + rollups.cost_nanos(30)
    entry = await adb(lambda: AuditEntry.objects.get(action="price-set"))()
    assert (
        entry.detail["before"]["inputPerMTok"] == 3.0
        and entry.detail["after"]["inputPerMTok"] == 30.0
    )
    # A replay of the first frame is still an exact replay (pricing is the server's addition).
    await runner.emit(
        "root-1",
        [usage(1_000_000, 100_000, cacheReadTokens=10_000, model="claude-sonnet-4-5-20250929")],
    )


async def test_it_shows_an_unknown_model_as_unpriced_and_a_cost_budget_as_unbounded(runner):
    await runner.open("root-1", budget={"maxCostUsd": 1.0})
    child = await runner.start("root-1", "a")
    await runner.emit(child["runId"], [usage(5000, 500, model="my-local-llama")])
    (event,) = await stored(child["runId"])
    assert event["costSource"] == "unpriced" and "costUsd" not in event

    def shapes():
        from delegation.models import Run

        run = Run.objects.select_related("rollup", "budget").get(run_id="root-1")
        return usage_of_run(run)

    usage_shape, budget = await adb(shapes)()
    assert usage_shape["subtree"]["unpricedEvents"] == 1
    assert usage_shape["subtree"]["costUsd"] == 0.0
    assert budget["limits"]["maxCostUsd"]["used"] == 0.0
    assert budget["costUnbounded"].startswith("cannot bound cost: 1 usage event")


def test_it_lets_only_admins_edit_prices_and_everyone_read_them(viewer, operator, admin):
    listed = Client().get("/api/prices", headers={"Authorization": f"Bearer {api_token(viewer)}"})
    assert listed.status_code == 200
    models = {item["model"] for item in listed.json()["items"]}
    # The presets' default models ship priced.
    assert {"claude-sonnet-4-5", "claude-sonnet-4.5", "gpt-5-codex", "gemini-2.5-pro"} <= models
    refused = put_price(api_token(operator), "m", {"inputPerMTok": 1, "outputPerMTok": 2})
    assert refused.status_code == 403
    assert AuditEntry.objects.filter(action="price-set", outcome="refused: not an admin").exists()
    bad = put_price(api_token(admin), "m", {"inputPerMTok": -1, "outputPerMTok": 2})
    assert bad.status_code == 422
    # Strict input: a boolean or a numeric string is not a price (it was taken as 0 and 4).
    for lax in (False, "4"):
        body = {"inputPerMTok": 1, "outputPerMTok": 2, "cacheWritePerMTok": lax}
        refused_lax = put_price(api_token(admin), "m", body)
        assert refused_lax.status_code == 422, lax
        assert "cacheWritePerMTok" in refused_lax.content.decode()
    assert not ModelPrice.objects.filter(model="m").exists()
    made = put_price(api_token(admin), "m", {"inputPerMTok": 1, "outputPerMTok": 2})
    assert made.status_code == 200 and made.json()["cacheReadPerMTok"] == 0
    gone = Client().delete("/api/prices/m", headers={"Authorization": f"Bearer {api_token(admin)}"})
    assert gone.status_code == 204 and not ModelPrice.objects.filter(model="m").exists()
    assert AuditEntry.objects.filter(action="price-delete", outcome="deleted").exists()

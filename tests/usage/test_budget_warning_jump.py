"""A usage event that jumps past 80% and 100% of a budget at once (issue 21): the
``budget-warning`` is stored before the ``budget-exceeded``, so an alert rule on warnings
fires as well."""

import pytest

from delegation.models import Event
from tests.support.rpc import adb

pytestmark = pytest.mark.django_db(transaction=True)


def _usage(tokens_in: int) -> dict:
    return {"kind": "usage", "input": {"inputTokens": tokens_in, "outputTokens": 0}}


def _budget_events() -> list[tuple[str, str]]:
    rows = Event.objects.filter(run__run_id="root-1", kind__startswith="budget-")
    return [(e.kind, e.data["limit"]) for e in rows.order_by("sequence")]


async def test_it_stores_the_warning_before_the_stop_when_usage_jumps_from_60_to_120_percent(
    runner,
):
    await runner.open("root-1", budget={"maxTokens": 100})
    await runner.emit("root-1", [_usage(60)])
    assert await adb(_budget_events)() == []
    await runner.emit("root-1", [_usage(60)], start=2)
    await runner.wait_command("run.cancel", runId="root-1")
    assert await adb(_budget_events)() == [
        ("budget-warning", "maxTokens"),
        ("budget-exceeded", "maxTokens"),
    ]

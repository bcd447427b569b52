"""SPEC §10 over the runner socket: usage events decoded strictly, rollups up the tree, and
budgets (admission with −32017 and `delegation-refused`, narrowing only, the stop on a cost
crossing, the time limit in the sweep). Runs on SQLite and on PostgreSQL."""

from datetime import timedelta

import pytest
from django.utils import timezone

from delegation.models import AuditEntry, Budget, Event, Run, RunRollup
from delegation.services import sweep
from tests.support.rpc import adb
from tests.support.state import assert_all_refused

pytestmark = pytest.mark.django_db(transaction=True)


def usage(tokens_in=0, tokens_out=0, **extra) -> dict:
    return {
        "kind": "usage",
        "input": {"inputTokens": tokens_in, "outputTokens": tokens_out, **extra},
    }


async def rollup(run_id: str) -> RunRollup:
    return await adb(lambda: RunRollup.objects.get(run__run_id=run_id))()


async def events_of(run_id: str, kind: str) -> list[Event]:
    return await adb(
        lambda: list(Event.objects.filter(run__run_id=run_id, kind=kind).order_by("sequence"))
    )()


async def test_it_refuses_malformed_usage_naming_the_field(runner):
    await runner.open("root-1")
    good = {"inputTokens": 1, "outputTokens": 2}

    def frame(index_of_bad, bad_input):
        events = [usage(1, 1) for _ in range(index_of_bad)]
        events.append({"kind": "usage", "input": bad_input})
        return {"runId": "root-1", "from": 1, "events": events}

    cases = [
        (frame(3, {**good, "costUsd": -0.5}), "events[3].input.costUsd"),
        (frame(0, {**good, "costUsd": "0.5"}), "events[0].input.costUsd"),
        # 1e999 is a valid JSON number that Python reads as infinity.
        (frame(1, {**good, "costUsd": float("inf")}), "events[1].input.costUsd"),
        (frame(0, {**good, "inputTokens": -1}), "events[0].input.inputTokens"),
        (frame(0, {**good, "outputTokens": 1.5}), "events[0].input.outputTokens"),
        (frame(0, {**good, "outputTokens": True}), "events[0].input.outputTokens"),
        (frame(0, {**good, "cacheReadTokens": "3"}), "events[0].input.cacheReadTokens"),
        (frame(0, {"inputTokens": 1}), "events[0].input.outputTokens"),
        (frame(2, {**good, "dollars": 3}), "events[2].input.dollars"),
        (frame(0, {**good, "model": 4}), "events[0].input.model"),
        (frame(0, ["inputTokens", 1]), "events[0].input"),
    ]
    # json.dumps writes inf as Infinity, which the strict decoder refuses as a parse error:
    # send the case that reaches validation (1e999) by hand.
    cases = [c for c in cases if c[1] != "events[1].input.costUsd"]
    await assert_all_refused(runner, "run.event", cases, -32602)
    raw = (
        '{"jsonrpc":"2.0","id":"inf","method":"run.event","params":{"runId":"root-1","from":1,'
        '"events":[{"kind":"usage","input":{"inputTokens":1,"outputTokens":1}},'
        '{"kind":"usage","input":{"inputTokens":1,"outputTokens":1,"costUsd":1e999}}]}}'
    )
    answer = await runner.raw_call(raw, "inf")
    assert answer["error"]["code"] == -32602
    assert "events[1].input.costUsd" in answer["error"]["message"]
    assert (await rollup("root-1")).own_usage_events == 0


async def test_it_rolls_usage_and_statuses_up_the_tree(runner):
    await runner.open("root-1")
    child = await runner.start("root-1", "a")
    grandchild = await runner.start(child["runId"], "b")
    await runner.emit(
        grandchild["runId"],
        [usage(100, 10, costUsd=0.25, cacheReadTokens=7, model="m"), "text", usage(5, 5)],
    )
    await runner.emit(child["runId"], [usage(1, 2, costUsd=0.5)])
    leaf = await rollup(grandchild["runId"])
    assert (leaf.own_tokens_in, leaf.own_tokens_out, leaf.own_cost_nanos) == (105, 15, 250_000_000)
    assert (leaf.own_cache_read, leaf.own_usage_events, leaf.sub_tokens_in) == (7, 2, 105)
    middle = await rollup(child["runId"])
    assert (middle.own_tokens_in, middle.sub_tokens_in, middle.sub_tokens_out) == (1, 106, 17)
    assert middle.sub_cost_nanos == 750_000_000 and middle.sub_cache_read == 7
    top = await rollup("root-1")
    assert (top.own_tokens_in, top.sub_tokens_in, top.sub_cost_nanos) == (0, 106, 750_000_000)
    assert (top.sub_running, top.sub_runs) == (3, 3)

    # A replayed frame adds nothing; a status change moves one count on every ancestor.
    await runner.emit(
        grandchild["runId"], [usage(100, 10, costUsd=0.25, cacheReadTokens=7, model="m")]
    )
    await runner.finish(grandchild["runId"], error="boom")
    top = await rollup("root-1")
    assert top.sub_tokens_in == 106
    assert (top.sub_running, top.sub_failed, top.sub_runs) == (2, 1, 3)
    assert top.sub_last_finished_at is not None
    middle = await rollup(child["runId"])
    assert (middle.sub_running, middle.sub_failed) == (1, 1)


async def test_it_refuses_a_start_past_max_runs_with_32017_and_the_event(runner):
    await runner.open("root-1", budget={"maxRuns": 2})
    first = await runner.start("root-1", "a")
    await runner.start(first["runId"], "b")  # a grandchild counts against the root's budget
    error = await runner.error("child.start", runner.start_params("root-1", "c"))
    assert error["code"] == -32017
    assert "budget exhausted" in error["message"] and "root-1" in error["message"]
    assert "maxRuns" in error["message"]
    assert error["data"] == {"budgetRunId": "root-1", "limit": "maxRuns"}
    refused = await events_of("root-1", "delegation-refused")
    assert len(refused) == 1 and refused[0].data["limit"] == "maxRuns"
    assert refused[0].data["budgetRunId"] == "root-1"
    # Refused deeper in the tree too: the grandchild's parent is under the same budget.
    error = await runner.error("child.start", runner.start_params(first["runId"], "d"))
    assert error["code"] == -32017
    assert len(await events_of(first["runId"], "delegation-refused")) == 1


async def test_it_refuses_a_start_past_max_live_until_one_finishes(runner):
    await runner.open("root-1", budget={"maxLive": 1})
    first = await runner.start("root-1", "a")
    error = await runner.error("child.start", runner.start_params("root-1", "b"))
    assert (error["code"], error["data"]["limit"]) == (-32017, "maxLive")
    await runner.finish(first["runId"], output="done")
    await runner.start("root-1", "b")


async def test_it_lets_a_runner_narrow_but_never_raise_a_budget(runner):
    await runner.open("root-1", budget={"maxTokens": 1000, "maxRuns": 5})
    # Re-opening with a wider budget is refused and changes nothing.
    error = await runner.error(
        "run.open",
        {
            "conversationId": "conv-root-1",
            "runId": "root-1",
            "budget": {"maxTokens": 2000, "maxRuns": 5},
        },
    )
    assert error["code"] == -32602 and "budget.maxTokens" in error["message"]
    error = await runner.error(
        "run.open",
        {"conversationId": "conv-root-1", "runId": "root-1", "budget": {"maxTokens": 10}},
    )
    assert error["code"] == -32602 and "budget.maxRuns" in error["message"]  # dropping one
    budget = await adb(lambda: Budget.objects.get(run__run_id="root-1"))()
    assert (budget.max_tokens, budget.max_runs) == (1000, 5)
    # A child may not ask for more than its ancestors allow...
    params = runner.start_params("root-1", "a", options={"budget": {"maxTokens": 5000}})
    error = await runner.error("child.start", params)
    assert error["code"] == -32602
    assert "request.options.budget.maxTokens" in error["message"] and "root-1" in error["message"]
    assert await adb(lambda: Run.objects.filter(parent__run_id="root-1").count())() == 0
    # ...but may narrow, and the narrower budget is the child's own.
    child = await runner.start(
        "root-1", "b", options={"budget": {"maxTokens": 500, "maxCostUsd": 1.5}}
    )
    budget = await adb(lambda: Budget.objects.get(run__run_id=child["runId"]))()
    assert (budget.max_tokens, budget.max_cost_nanos) == (500, 1_500_000_000)
    # And narrowing again on the root is fine.
    await runner.open("root-1", budget={"maxTokens": 900, "maxRuns": 5})
    budget = await adb(lambda: Budget.objects.get(run__run_id="root-1"))()
    assert budget.max_tokens == 900


async def test_it_refuses_malformed_budgets_naming_the_field(runner):
    await runner.open("root-1")
    cases = [
        ({"conversationId": "c2", "runId": "r2", "budget": {"maxRuns": -1}}, "budget.maxRuns"),
        ({"conversationId": "c2", "runId": "r2", "budget": {"maxCost": 1}}, "budget.maxCost"),
        (
            {"conversationId": "c2", "runId": "r2", "budget": {"maxCostUsd": "1"}},
            "budget.maxCostUsd",
        ),
        ({"conversationId": "c2", "runId": "r2", "budget": {"maxSeconds": 0}}, "budget.maxSeconds"),
        ({"conversationId": "c2", "runId": "r2", "budget": None}, "budget"),
    ]
    await assert_all_refused(runner, "run.open", cases, -32602)
    bad = runner.start_params("root-1", "a", options={"budget": {"maxLive": 1.5}})
    await assert_all_refused(
        runner, "child.start", [(bad, "request.options.budget.maxLive")], -32602
    )


async def test_it_stops_every_descendant_when_cost_crosses_the_budget(runner):
    await runner.open("root-1", budget={"maxCostUsd": 1.0})
    children = [await runner.start("root-1", f"c{i}") for i in range(2)]
    grandchildren = [await runner.start(children[0]["runId"], f"g{i}") for i in range(2)]
    worker = grandchildren[0]["runId"]
    step = 0.3
    index = 1
    for _ in range(3):  # 0.9: past 80%, a warning, nothing stopped
        await runner.emit(worker, [usage(10, 10, costUsd=step)], start=index)
        index += 1
    warnings = await events_of("root-1", "budget-warning")
    assert len(warnings) == 1 and warnings[0].actor == "budget"
    assert await adb(lambda: Run.objects.filter(cancel_requested_at__isnull=False).count())() == 0
    await runner.emit(worker, [usage(10, 10, costUsd=step)], start=index)  # 1.2: crossed
    everyone = ["root-1", *(c["runId"] for c in children), *(g["runId"] for g in grandchildren)]
    for run_id in everyone:
        await runner.wait_command("run.cancel", runId=run_id)
    stopped = await adb(lambda: dict(Run.objects.values_list("run_id", "cancel_reason")))()
    assert all(stopped[r].startswith("budget exceeded: maxCostUsd") for r in everyone), stopped
    exceeded = await events_of("root-1", "budget-exceeded")
    assert len(exceeded) == 1
    # The overshoot is at most the usage event that crossed the limit.
    assert exceeded[0].data["costUsd"] <= 1.0 + step + 1e-9
    # Money in dollars, as in REST (not the nano-dollars the rollups count in).
    assert exceeded[0].data["limit"] == "maxCostUsd" and exceeded[0].data["cap"] == 1.0
    entry = await adb(lambda: AuditEntry.objects.get(action="cancel-subtree"))()
    assert entry.actor == "budget" and entry.target_id == "root-1"
    assert {d["runId"] for d in entry.detail["descendants"]} == set(everyone) - {"root-1"}
    # Further starts under the budget are refused; more usage does not stop it twice.
    error = await runner.error("child.start", runner.start_params(children[1]["runId"], "late"))
    assert error["code"] == -32017
    await runner.emit(worker, [usage(1, 1, costUsd=0.1)], start=index + 1)
    assert len(await events_of("root-1", "budget-exceeded")) == 1
    assert len(await events_of("root-1", "budget-warning")) == 1


async def test_it_stops_a_slow_tree_on_max_seconds_in_one_sweep(runner):
    await runner.open("root-1", budget={"maxSeconds": 600})
    child = await runner.start("root-1", "a")
    assert (await adb(sweep.sweep)()).budget_stops == []
    # Started 11 minutes ago rather than sleeping: the next sweep is past the limit.
    await adb(
        lambda: Run.objects.filter(run_id="root-1").update(
            created_at=timezone.now() - timedelta(minutes=11)
        )
    )()
    report = await adb(sweep.sweep)()
    assert len(report.budget_stops) == 1
    await runner.wait_command("run.cancel", runId=child["runId"])
    await runner.wait_command("run.cancel", runId="root-1")
    exceeded = await events_of("root-1", "budget-exceeded")
    assert len(exceeded) == 1 and "maxSeconds" in exceeded[0].text
    budget = await adb(lambda: Budget.objects.get(run__run_id="root-1"))()
    assert budget.exceeded_reason.startswith("budget exceeded: maxSeconds 600s")
    assert (await adb(sweep.sweep)()).budget_stops == []  # once


async def test_it_stops_on_max_tokens_below_the_budget_run(runner):
    """A budget on a child bounds only the child's subtree, not its siblings or parent."""
    await runner.open("root-1")
    bounded = await runner.start("root-1", "a", options={"budget": {"maxTokens": 100}})
    sibling = await runner.start("root-1", "b")
    leaf = await runner.start(bounded["runId"], "c")
    await runner.emit(leaf["runId"], [usage(60, 50)])
    await runner.wait_command("run.cancel", runId=leaf["runId"])
    await runner.wait_command("run.cancel", runId=bounded["runId"])
    live = await adb(
        lambda: set(
            Run.objects.filter(cancel_requested_at__isnull=True).values_list("run_id", flat=True)
        )
    )()
    assert live == {"root-1", sibling["runId"]}


def test_it_has_the_scripted_engine_report_usage_per_turn_in_the_spec_shape():
    import random

    from delegation.runner.scripted import PRICES_PER_MTOK, turn_usage
    from delegation.wire import Usage

    rng = random.Random(7)
    turns = [turn_usage(rng, turn) for turn in range(4)]
    for figures in turns:
        parsed = Usage.model_validate(figures, strict=True)  # exactly the SPEC keys
        price_in, price_out, price_read, price_write = PRICES_PER_MTOK
        expected = (
            parsed.input_tokens * price_in
            + parsed.output_tokens * price_out
            + parsed.cache_read_tokens * price_read
            + parsed.cache_write_tokens * price_write
        ) / 1e6
        assert parsed.cost_usd == pytest.approx(expected, abs=1e-6) and parsed.cost_usd > 0
    # Later turns read most of a growing prompt from the cache, as agents' reports show.
    assert turns[0]["cacheReadTokens"] == 0 and all(t["cacheReadTokens"] > 0 for t in turns[1:])

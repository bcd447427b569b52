"""SPEC §10 in a real browser: an operator sets a budget on the run page, the tree shows the
budget bar filling live as usage commits, and once the cost crosses the limit the subtree
stops, with the reason on the tree, the run page and the overview."""

from __future__ import annotations

import pytest

from tests.support.browser import needs_chromium, sign_in, wait_status
from tests.support.personas import PASSWORD

pytestmark = [
    pytest.mark.django_db(transaction=True),
    needs_chromium,
    pytest.mark.timeout(180),
]


def usage(cost: float) -> dict:
    return {"kind": "usage", "input": {"inputTokens": 1000, "outputTokens": 200, "costUsd": cost}}


def test_it_shows_the_budget_bar_and_why_a_subtree_stopped(server, runner, browser, operator):
    runner.open("root-1")
    child = runner.child("root-1", "c1", "write the parser")["runId"]
    leaf = runner.child(child, "g1", "part one")["runId"]
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/root-1/")
    page.wait_for_selector('#budget [data-role="no-budget"]')
    page.fill('#budget-form input[name="maxCostUsd"]', "1")
    page.fill('#budget-form input[name="reason"]', "demo limit")
    page.click("[data-action=set-budget]")
    bar = page.wait_for_selector('#budget .budget-row[data-limit="maxCostUsd"]')
    assert "0 / 1" in bar.text_content()

    page.goto(f"{server.http_url}/trees/root-1/")
    marker = page.wait_for_selector('#tree [data-run-id="root-1"] [data-role="budget"]')
    assert marker.get_attribute("data-level") == "ok"
    runner.emit(leaf, usage(0.85))
    # The root's row follows its rollup live: the subtree's cost and a bar past 80%.
    page.wait_for_selector('#tree [data-run-id="root-1"] [data-role="budget"][data-level="warn"]')
    cost = page.text_content('#tree [data-run-id="root-1"] [data-role="cost"]')
    assert cost == "$0.8500"
    runner.emit(leaf, usage(0.3))
    for run_id in ("root-1", child, leaf):
        wait_status(page, run_id, "cancelled", "#tree")
    stopped = page.wait_for_selector(
        '#tree [data-run-id="root-1"] [data-role="budget"][data-level="over"]'
    )
    assert "stopped" in stopped.text_content()
    assert stopped.get_attribute("title").startswith("budget exceeded: maxCostUsd $1")

    page.goto(f"{server.http_url}/runs/root-1/")
    reason = page.wait_for_selector('[data-role="budget-stop"]')
    assert "budget exceeded: maxCostUsd $1" in reason.text_content()
    over = page.wait_for_selector('#budget .budget-row[data-limit="maxCostUsd"]')
    assert over.get_attribute("data-level") == "over"
    # The bar's width is set by the page's script (no inline styles under the CSP).
    width = page.evaluate(
        "document.querySelector('#budget .budget-row[data-limit=maxCostUsd] .budget-bar > i')"
        ".style.width"
    )
    assert width == "100%"
    page.wait_for_selector('#events [data-kind="budget-exceeded"]')

    page.goto(f"{server.http_url}/trees/")
    page.wait_for_selector('#trees-table tr[data-run-id="root-1"] [data-role="budget-stopped"]')

"""Nothing stale (issue 38), in Chromium: the tree page's side pane drops Cancel and Steer the
moment its run finishes (the tree's live row says so before the next REST read), and the run
page's "N live" follows a cancel of the subtree without a reload."""

from __future__ import annotations

import pytest

from tests.support.browser import needs_chromium, sign_in
from tests.support.personas import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(120)]


def test_it_drops_the_side_panes_actions_when_its_run_finishes(server, runner, browser, operator):
    runner.open("stale-1", message="Ship the notes")
    child = runner.child("stale-1", "req-1", message="Write the notes")["runId"]
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/stale-1/?run={child}")
    pane = page.locator(f'#run-detail[data-run-id="{child}"]')
    pane.wait_for()
    assert pane.locator("[data-action=row-cancel]").is_visible()
    assert pane.locator("[data-action=row-steer]").is_visible()
    runner.finish(child, output="notes written")
    # The live row rings first: well before the pane's 2 s REST refresh.
    page.wait_for_selector(
        f'#run-detail[data-run-id="{child}"][data-status=succeeded]', timeout=1500
    )
    assert pane.locator("[data-role=status]").inner_text() == "succeeded"
    assert not pane.locator("[data-action=row-cancel]").is_visible()
    assert not pane.locator("[data-action=row-steer]").is_visible()
    # Selecting a running run offers them again.
    page.locator('#tree .trow[data-run-id="stale-1"]').click()
    page.wait_for_selector('#run-detail[data-run-id="stale-1"][data-status=running]')
    assert page.locator("#run-detail [data-action=row-cancel]").is_visible()


def test_it_updates_the_run_pages_live_count_after_a_cancel_without_a_reload(
    server, runner, browser, operator, operator_token
):
    api = {"Authorization": f"Bearer {operator_token}"}
    runner.open("stale-2", message="Count the words")
    one = runner.child("stale-2", "req-1", message="Count chapter one")["runId"]
    runner.child("stale-2", "req-2", message="Count chapter two")
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    budget = page.request.put(
        f"{server.http_url}/api/runs/stale-2/budget", headers=api, data={"maxLive": 5}
    )
    assert budget.status == 200, budget.text()
    page.goto(f"{server.http_url}/runs/stale-2/")
    page_budget = page.locator('#budget .budget-row[data-limit="maxLive"]')
    # Labels in words, the field's name in the tooltip.
    assert page_budget.locator("[data-role=budget-label]").inner_text() == "Running at once"
    assert page_budget.locator("[data-role=budget-used]").inner_text() == "2 / 5"
    runs = page.locator("#usage-rollup [data-field=runs]")
    assert runs.inner_text() == "3 in the subtree, 3 live"
    cancelled = page.request.post(
        f"{server.http_url}/api/runs/{one}/cancel", headers=api, data={"reason": "enough"}
    )
    assert cancelled.status == 200, cancelled.text()
    page.wait_for_selector(
        '#budget .budget-row[data-limit="maxLive"] [data-role=budget-used]:text-is("1 / 5")',
        timeout=4000,
    )
    page.wait_for_selector(
        "#usage-rollup [data-field=runs]:text-is('3 in the subtree, 2 live')", timeout=4000
    )
    page.wait_for_selector("[data-role=live-descendants]:text-is('1')", timeout=4000)


def test_it_says_the_result_in_words_and_follows_the_finish(server, runner, browser, operator):
    runner.open("words-1", message="Sum the invoices")
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/words-1/")
    summary = page.locator("#result [data-role=result-summary]")
    assert summary.inner_text() == "Still running."
    # The wire Result's fields are folded away, labelled in words, not a raw dump.
    ids = page.locator("#result details.result-ids")
    assert ids.get_attribute("open") is None
    assert not page.locator("#identity").is_visible()
    ids.locator("summary").click()
    labels = page.locator("#identity dt").all_inner_texts()
    assert "conversation" in labels and "conversationId" not in labels
    runner.finish("words-1", output="The invoices sum to 1,204 EUR.")
    page.wait_for_selector("#result [data-role=result-summary]:text-is('Finished: it succeeded.')")
    assert page.inner_text("#result [data-field=output]") == "The invoices sum to 1,204 EUR."
    assert page.inner_text('#identity [data-field="done"]') == "yes"

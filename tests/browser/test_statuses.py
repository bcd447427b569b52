"""The page shows the server's states, never its own (issue 34), in Chromium: a runner
revoked while the runners page is open shows as revoked (Runner.state, revoked first; the page
used to work it out again and said "disconnected"), and a paused run shows as paused on the
tree page, the trees overview and the run page (the scripts' five status lists lacked it; now
one list, rendered from the model's choices)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from delegation.models import RunnerState, RunStatus
from delegation.services import tokens
from tests.support.browser import needs_chromium, sign_in
from tests.support.personas import PASSWORD


def _in_a_thread(call):
    """Playwright's sync API runs an event loop in this thread; the service's after-commit
    doorbell (async_to_sync) must ring from a thread without one, as a request's would."""
    from django.db import connection

    def run():
        try:
            return call()
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(120)]


def test_a_runner_revoked_while_the_page_is_open_shows_as_revoked(
    server, runner, browser, operator
):
    runner.open("rev-1", message="Hold the line")
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runners/")
    row = page.locator('#runners-table tr[data-runner-id="runner-b"]')
    row.locator("[data-role=connection][data-state=connected]").wait_for()
    vocabulary = json.loads(page.locator("#canopy-vocabulary").text_content())
    assert vocabulary["runnerStates"] == list(RunnerState.values)
    assert vocabulary["runStatuses"] == list(RunStatus.values)

    assert _in_a_thread(lambda: tokens.revoke_runner("runner-b"))
    # Live, without a reload: the runners frame carries the server's state (at once on a
    # shared channel layer; within a heartbeat's catch-up, 10 s, on the in-memory one, which
    # this process's doorbell cannot reach).
    cell = row.locator("[data-role=connection][data-state=revoked]")
    cell.wait_for(timeout=15000)
    assert cell.inner_text() == "revoked"
    assert row.get_attribute("data-connected") == "0"
    # And the page as first rendered says the same.
    page.reload()
    assert row.locator("[data-role=connection]").get_attribute("data-state") == "revoked"
    assert row.locator("[data-role=connection]").inner_text() == "revoked"


def test_a_paused_run_shows_as_paused_on_every_page(
    server, runner, browser, operator, operator_token
):
    api = {"Authorization": f"Bearer {operator_token}"}
    runner.open("pause-1", message="Index the archive")
    child = runner.child("pause-1", "req-1", message="Index volume one")["runId"]
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/{child}/")
    summary = page.locator("#result [data-role=result-summary]")
    assert summary.inner_text() == "Still running."
    paused = page.request.post(
        f"{server.http_url}/api/runs/{child}/pause", headers=api, data={"reason": "hold on"}
    )
    assert paused.status == 200, paused.text()
    page.wait_for_selector(
        "#result [data-role=result-summary]:text-is('Paused: it waits for an operator to resume it.')",
        timeout=5000,
    )
    page.reload()
    assert summary.inner_text() == "Paused: it waits for an operator to resume it."

    page.goto(f"{server.http_url}/trees/pause-1/")
    page.wait_for_selector(f'#tree .trow[data-run-id="{child}"][data-status=paused]')
    counts = page.locator("#tree-counts .count-paused")
    counts.wait_for(timeout=5000)
    assert counts.inner_text() == "1 paused"
    assert page.locator("#status-filter input[value=paused]").count() == 1

    page.goto(f"{server.http_url}/trees/")
    row = page.locator('#trees-table tr[data-tree-id="pause-1"]')
    # The live summary's counts, drawn from the one list.
    row.locator('[data-role=counts] [data-count="paused"]').wait_for(timeout=5000)
    assert row.locator('[data-role=counts] [data-count="paused"]').inner_text() == "1"

"""Names, not ids (issue 25): a run's task names it on the overview, the tree and run pages
and the tab title, also for a root its runner opened (``runner --root MESSAGE``); the id is
a copyable second line, and a long task is cut with an ellipsis, whole in the tooltip."""

from __future__ import annotations

import pytest

from tests.support.browser import needs_chromium, screenshot_name, sign_in
from tests.support.personas import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(120)]

TASK = "Summarise the incident reports of last week and list every service that paged twice"


def test_it_names_a_root_opened_by_its_runner_by_its_task_on_every_page(
    server, runner, browser, operator
):
    runner.open("root-1", message=TASK + "\n\nDetails follow on the next lines.")
    runner.child("root-1", "req-1", message="Read the pager log")
    page = browser()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/")
    row = page.locator('#trees-table tr[data-tree-id="root-1"]')
    task = row.locator("[data-role=task]")
    assert task.inner_text() == TASK  # the first line only
    assert task.get_attribute("title") == TASK
    assert row.locator("[data-role=run-id]").inner_text() == "root-1"
    # Cut with an ellipsis at the column's width, never silently mid-word without a tooltip.
    assert task.evaluate("e => getComputedStyle(e).textOverflow") == "ellipsis"
    row.locator("[data-copy]").click()
    assert page.evaluate("navigator.clipboard.readText()") == "root-1"
    page.screenshot(path=str(screenshot_name("names-overview")))

    page.goto(f"{server.http_url}/trees/root-1/")
    assert page.title().startswith(TASK[:40])
    assert page.inner_text("h1 [data-role=task]") == TASK
    assert page.inner_text("h1 [data-role=run-id]") == "root-1"
    page.wait_for_selector('[data-role=task]:text("Read the pager log")')
    page.screenshot(path=str(screenshot_name("names-tree")))

    page.goto(f"{server.http_url}/runs/root-1/")
    assert page.title().startswith(TASK[:40])
    assert page.inner_text("h1 [data-role=task]") == TASK
    assert TASK in page.inner_text("[data-field=message]")
    page.screenshot(path=str(screenshot_name("names-run")))

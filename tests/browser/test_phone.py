"""Usable on a phone (issue 38), in Chromium at 390×844 and at 1280×800: no page scrolls
sideways, the navigation collapses behind a Menu button, the tree is a list of task-named rows
with status and cost, and the inbox's buttons are within reach."""

from __future__ import annotations

import pytest

from tests.support.browser import needs_chromium, screenshot_name, sign_in
from tests.support.personas import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(180)]

OVERFLOW = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"


def _world(runner) -> tuple[str, str]:
    runner.open("phone-1", message="Prepare the quarterly report for the board")
    child = runner.child("phone-1", "req-1", message="Collect the sales figures per region")
    runner.child("phone-1", "req-2", message="Draft the summary")
    asked = runner.call(
        "approval.request",
        {
            "runId": child["runId"],
            "toolCallId": "t-1",
            "toolName": "Bash",
            "input": {"command": "psql -c 'select * from sales'", "description": "Read sales"},
        },
    )
    return child["runId"], asked["approvalId"]


@pytest.mark.parametrize("size", [(390, 844), (1280, 800)], ids=["phone", "laptop"])
def test_it_fits_every_page_without_sideways_scrolling(server, runner, browser, operator, size):
    child, approval = _world(runner)
    page = browser()
    page.set_viewport_size({"width": size[0], "height": size[1]})
    sign_in(page, server.http_url, operator.username, PASSWORD)
    for path, ready in (
        ("/trees/", "#trees-table tr[data-tree-id='phone-1']"),
        ("/trees/phone-1/", f"#tree .trow[data-run-id='{child}']"),
        (f"/runs/{child}/", "#events"),
        ("/approvals/", f"[data-approval-id='{approval}'] [data-action=allow]"),
        ("/runners/", "main"),
        ("/audit/", "main"),
        ("/launch/", "main"),
        ("/leases/", "#leases-table"),
    ):
        page.goto(f"{server.http_url}{path}")
        page.wait_for_selector(ready)
        page.wait_for_timeout(300)  # live rows and cards painted
        name = f"phone-{size[0]}-{path.strip('/').replace('/', '-') or 'home'}"
        page.screenshot(path=str(screenshot_name(name)), full_page=True)
        assert page.evaluate(OVERFLOW) <= 0, f"{path} scrolls sideways at {size[0]} px"


def test_it_collapses_the_navigation_and_names_rows_on_a_phone(server, runner, browser, operator):
    child, approval = _world(runner)
    page = browser()
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/phone-1/")
    # The navigation hides behind Menu, and opens with a tap.
    trees_link = page.locator(".nav a", has_text="Runners")
    assert not trees_link.is_visible()
    page.click("[data-action=nav-toggle]")
    assert trees_link.is_visible()
    page.click("[data-action=nav-toggle]")
    # The tree: task-named rows with status and cost, nothing cut to nothing.
    row = page.locator(f"#tree .trow[data-run-id='{child}']")
    row.wait_for()
    task = row.locator("[data-role=task]")
    assert task.inner_text() == "Collect the sales figures per region"
    assert task.bounding_box()["width"] >= 150
    for role in ("task", "cost"):
        box = row.locator(f"[data-role={role}]").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, role
    assert row.locator(".chip").is_visible()

    # The run page: its actions sit under the title, not over it.
    page.goto(f"{server.http_url}/runs/{child}/")
    title = page.locator("h1").bounding_box()
    cancel = page.locator("[data-action=cancel]").bounding_box()
    assert cancel["y"] >= title["y"] + title["height"], "Cancel covers the title"
    assert "{#" not in page.inner_text("main")

    # The inbox: the card's buttons are on screen and a thumb can press them.
    page.goto(f"{server.http_url}/approvals/")
    card = page.locator(f"[data-approval-id='{approval}']")
    allow = card.locator("[data-action=allow]")
    allow.wait_for()
    for action in ("allow", "deny"):
        box = card.locator(f"[data-action={action}]").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, action
        assert box["height"] >= 32, f"{action} is too small to tap"
    allow.click()
    card.locator("[data-role=outcome]:has-text('allow by operator:')").wait_for()

"""Names first, nothing stale (issue 38), in Chromium: tree rows give the task the space and
the run id a short second mark, with cost and markers on screen beside the side pane at
1280 px; inbox cards name the run and the tree by their tasks and say what the agent said the
command does; their ages tick; after "edit, then allow" the card shows the edited input and
then leaves; a card decided elsewhere leaves even when focused; the status pill says Live."""

from __future__ import annotations

import json

import pytest

from tests.support.browser import needs_chromium, screenshot_name, sign_in
from tests.support.personas import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(120)]


def test_it_names_tree_rows_by_task_with_cost_on_screen_beside_the_pane(
    server, runner, browser, operator
):
    runner.open("names-1", message="Tidy the release notes")
    first = runner.child("names-1", "req-1", message="Fix the changelog typos in 2.4")["runId"]
    second = runner.child("names-1", "req-2", message="Fix the changelog typos in 2.5")["runId"]
    page = browser()
    page.set_viewport_size({"width": 1280, "height": 800})
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/names-1/?run={first}")
    page.wait_for_selector(f'#run-detail[data-run-id="{first}"]')
    rows = {}
    for run_id, task in ((first, "2.4"), (second, "2.5")):
        row = page.locator(f'#tree .trow[data-run-id="{run_id}"]')
        row.locator("[data-role=task]").wait_for()
        shown = row.locator("[data-role=task]")
        # The whole task fits: siblings read apart by what they do, not by their ids.
        assert shown.inner_text() == f"Fix the changelog typos in {task}"
        assert shown.evaluate("e => e.scrollWidth <= e.clientWidth")
        task_box = shown.bounding_box()
        id_box = row.locator("[data-role=run-id]").bounding_box()
        assert task_box["width"] > 2 * id_box["width"]
        assert task_box["x"] < id_box["x"]  # the name first, the id after it
        rows[run_id] = row
    cost = rows[first].locator("[data-role=cost]").bounding_box()
    pane = page.locator("#run-detail").bounding_box()
    assert cost["x"] + cost["width"] <= pane["x"], "the cost is hidden under the side pane"
    page.screenshot(path=str(screenshot_name("names-first-tree")))
    # The run page's crumbs name the tree by its task too.
    page.goto(f"{server.http_url}/runs/{second}/")
    crumb = page.locator(".crumbs [data-role=crumb-tree]")
    assert crumb.inner_text() == "Tidy the release notes"
    assert crumb.get_attribute("title") == "names-1"


def _ask(runner, run_id: str, call: str, command: str, description: str) -> str:
    asked = runner.call(
        "approval.request",
        {
            "runId": run_id,
            "toolCallId": call,
            "toolName": "Bash",
            "input": {"command": command, "description": description},
        },
    )
    assert asked["status"] == "pending"
    return asked["approvalId"]


def test_it_shows_inbox_cards_by_name_live_and_leaves_none_stale(
    server, runner, browser, operator, operator_token
):
    runner.open("inbox-n", message="Tidy the release notes")
    child = runner.child("inbox-n", "req-1", message="Clean the build tree")["runId"]
    first = _ask(runner, child, "t-1", "rm -rf build", "Remove the build directory")
    page = browser()
    page.add_init_script("window.canopyDecidedLingerMs = 1500")
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/approvals/")
    card = page.locator(f"#approvals [data-approval-id='{first}']")
    card.locator("[data-action=allow]").wait_for()
    assert card.locator("[data-field=task]").inner_text() == "Clean the build tree"
    assert card.locator("[data-field=rootTask]").inner_text() == "Tidy the release notes"
    assert card.locator("[data-field=description]").inner_text() == "Remove the build directory"
    # The pill says what the page is: live, not "Static".
    page.wait_for_selector("#live-state[data-state=live] .live-label:text-is('Live')")
    # The age ticks without a new read.
    age = card.locator("[data-role=age]")
    before = age.inner_text()
    page.wait_for_function(
        "([el, was]) => el.textContent !== was", arg=[age.element_handle(), before], timeout=3000
    )

    # Edit, then allow: the card shows what was allowed, then leaves.
    card.locator("[data-action=edit]").click()
    card.locator("[name=updatedInput]").fill(json.dumps({"command": "rm -rf build/tmp"}))
    card.locator("[data-action=edit]").click()
    card.locator("[data-role=outcome]:has-text('allow by operator:')").wait_for()
    assert card.locator("[data-field=input]").inner_text() == "$ rm -rf build/tmp"
    card.wait_for(state="detached", timeout=5000)

    # A focused card decided elsewhere leaves too.
    second = _ask(runner, child, "t-2", "ls build", "List what is left")
    other = page.locator(f"#approvals [data-approval-id='{second}']")
    other.locator("[data-action=allow]").wait_for()
    other.focus()
    decided = page.request.post(
        f"{server.http_url}/api/approvals/{second}/decision",
        headers={"Authorization": f"Bearer {operator_token}"},
        data={"decision": "deny", "message": "not now"},
    )
    assert decided.status == 200, decided.text()
    other.wait_for(state="detached", timeout=5000)
    page.wait_for_selector("#approvals [data-role=empty]")


NOTIFICATION_STUB = """
window.__notes = [];
window.Notification = class {
  constructor(title, options) { window.__notes.push({ title, body: options.body }); }
  static permission = "default";
  static requestPermission() { window.Notification.permission = "granted"; return Promise.resolve("granted"); }
};
"""


def test_it_counts_approvals_in_the_tab_title_and_notifies_new_ones_once_opted_in(
    server, runner, browser, operator
):
    runner.open("notify-1", message="Tidy the release notes")
    child = runner.child("notify-1", "req-1", message="Clean the build tree")["runId"]
    _ask(runner, child, "t-1", "rm -rf build", "Remove the build directory")
    page = browser()
    page.add_init_script(NOTIFICATION_STUB)
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/approvals/")
    page.wait_for_function("() => document.title.startsWith('(1) Approvals')")
    page.wait_for_selector("#live-state[data-state=live]")
    button = page.locator("[data-action=notify]")
    assert button.inner_text() == "Notify me of new approvals"
    button.click()
    page.wait_for_selector("[data-action=notify][data-on='1']")
    # Pending when the page opened: on screen already, no notification.
    assert page.evaluate("window.__notes.length") == 0
    _ask(runner, child, "t-2", "ls build", "List what is left")
    page.wait_for_function("() => window.__notes.length === 1", timeout=5000)
    note = page.evaluate("window.__notes[0]")
    assert note["title"] == "Approval: Bash in Clean the build tree"
    assert "List what is left" in note["body"] and "$ ls build" in note["body"]
    page.wait_for_function("() => document.title.startsWith('(2) Approvals')")

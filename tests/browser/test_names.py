"""Names, not ids (issue 25): a run's task names it on the overview, the tree and run pages
and the tab title, also for a root its runner opened (``runner --root MESSAGE``); the id is
a copyable second line, and a long task is cut with an ellipsis, whole in the tooltip."""

from __future__ import annotations

import pytest

from tests.support.browser import needs_chromium, screenshot_name, sign_in
from tests.support.personas import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(120)]

AXIS_PX = 22  # timeline.js: the time axis' height above the first lane
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


def _usage(cost: float) -> dict:
    return {"kind": "usage", "input": {"inputTokens": 100, "outputTokens": 20, "costUsd": cost}}


def test_it_shows_overview_numbers_equal_to_the_rest_counts(server, runner, browser, operator):
    runner.open("root-a", message="Fix the flaky login test")
    runner.emit("root-a", _usage(0.25))
    runner.child("root-a", "req-1", message="Read the CI log")
    runner.open("root-b", message="Upgrade the database driver")
    runner.emit("root-b", _usage(0.5))
    runner.finish("root-b", error="driver would not build")
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/")
    rest = page.request.get(f"{server.http_url}/api/overview").json()
    assert (rest["liveRuns"], rest["failedLastHour"], rest["liveRoots"]) == (2, 1, 1)
    assert rest["costLastDayUsd"] == pytest.approx(0.75)
    shown = {
        card.get_attribute("data-stat"): card.locator("[data-role=value]").inner_text()
        for card in page.locator("#overview-stats [data-stat]").all()
    }
    assert shown == {
        "liveRuns": str(rest["liveRuns"]),
        "failedLastHour": str(rest["failedLastHour"]),
        "failedLastDay": str(rest["failedLastDay"]),
        "pendingApprovals": str(rest["pendingApprovals"]),
        "costLastHourUsd": f"${rest['costLastHourUsd']:.4f}",
        "costLastDayUsd": f"${rest['costLastDayUsd']:.4f}",
    }
    # Every colour has its legend; the status bar has one segment per status present.
    legend = page.locator("[data-role=status-legend] [data-status]")
    assert {item.get_attribute("data-status") for item in legend.all()} >= {"running", "failed"}
    assert page.locator("#status-chart .seg").count() == 2
    assert page.locator("#cost-chart rect.bar-cost").count() == 24
    # Live: a failure committed after the page loaded shows within a refresh.
    runner.finish("root-a", error="gave up")
    page.wait_for_selector('[data-stat=failedLastHour] [data-role=value]:text-is("2")')
    page.screenshot(path=str(screenshot_name("overview")))


def test_it_relaunches_a_run_with_an_edited_message_linked_to_the_original(
    server, runner, browser, operator, operator_token
):
    from django.core.management import call_command

    from delegation.models import AuditEntry, Run

    api = {"Authorization": f"Bearer {operator_token}"}
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    launched = page.request.post(
        f"{server.http_url}/api/runs",
        headers=api,
        data={
            "runner": "runner-b",
            "profile": "worker",
            "message": "Count the TODOs",
            "budget": {"maxRuns": 7},
        },
    )
    assert launched.status == 201, launched.text()
    original = launched.json()["runId"]
    page.goto(f"{server.http_url}/runs/{original}/")
    page.fill("#relaunch-message", "Count the TODOs and the FIXMEs")
    with page.expect_navigation():
        page.click("[data-action=relaunch]")
    again = page.inner_text("h1 [data-role=run-id]")
    assert again != original
    assert page.inner_text("[data-role=relaunched-from]") == original
    assert page.inner_text("h1 [data-role=task]") == "Count the TODOs and the FIXMEs"
    page.screenshot(path=str(screenshot_name("relaunch")))
    detail = page.request.get(f"{server.http_url}/api/runs/{again}", headers=api).json()
    assert detail["relaunchedFrom"] == original and detail["profile"] == "worker"
    assert detail["budget"]["limits"]["maxRuns"]["limit"] == 7  # the same budget
    assert page.request.get(f"{server.http_url}/api/runs/{original}", headers=api).json()[
        "relaunches"
    ] == [again]
    # REST: without a message, the original's message runs again.
    third = page.request.post(f"{server.http_url}/api/runs/{original}/relaunch", headers=api)
    assert third.status == 201, third.text()
    assert Run.objects.get(run_id=third.json()["runId"]).request["message"] == "Count the TODOs"
    # manage.py launch --from, with a new message.
    call_command("launch", "--from", original, "--message", "Only the FIXMEs")
    fourth = Run.objects.filter(relaunched_from__run_id=original).order_by("-id").first()
    assert fourth.request["message"] == "Only the FIXMEs" and fourth.via == "launch"
    assert AuditEntry.objects.filter(action="launch", outcome="launched").count() == 4


def _tool(name: str, call: str) -> dict:
    return {"kind": "tool-use", "toolName": name, "toolCallId": call, "input": {}}


def test_it_compares_two_seeded_runs_step_by_step_with_the_deltas(
    server, runner, browser, operator, operator_token
):
    runner.open("cmp-a", message="Find the slow query")
    runner.emit(
        "cmp-a",
        _tool("Read", "a1"),
        _tool("Grep", "a2"),
        {"kind": "text", "text": "It is the join"},
    )
    runner.emit("cmp-a", _usage(0.1))
    runner.finish("cmp-a", output="the join")
    runner.open("cmp-b", message="Find the slow query")
    runner.emit(
        "cmp-b",
        _tool("Read", "b1"),
        _tool("Bash", "b2"),  # the seeded extra step
        _tool("Grep", "b3"),
        {"kind": "text", "text": "It is the index"},  # the seeded changed text
    )
    runner.emit("cmp-b", _usage(0.3))
    runner.finish("cmp-b", error="gave up")
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/cmp-a/")
    page.fill("#compare-form input[name=with]", "cmp-b")
    with page.expect_navigation():
        page.click("[data-action=compare]")
    changes = page.eval_on_selector_all(
        "#compare-steps tr[data-change]", "rows => rows.map(r => r.dataset.change)"
    )
    assert changes == ["same", "only-b", "same", "changed"]
    assert "Bash" in page.inner_text("#compare-steps tr[data-change=only-b]")
    assert page.inner_text("[data-delta=tokens]") == "+0"
    assert page.inner_text("[data-delta=costUsd]") == "+0.2000"
    assert page.inner_text("[data-delta=outcome]") == "succeeded → failed"
    page.screenshot(path=str(screenshot_name("compare")))
    rest = page.request.get(
        f"{server.http_url}/api/runs/cmp-a/compare/cmp-b",
        headers={"Authorization": f"Bearer {operator_token}"},
    ).json()
    assert [s["change"] for s in rest["steps"]] == changes and rest["differences"] == 2
    assert rest["deltas"]["costUsd"] == pytest.approx(0.2)


def test_it_updates_the_own_and_subtree_usage_card_when_usage_commits(
    server, runner, browser, operator
):
    runner.open("use-1", message="Profile the importer")
    child = runner.child("use-1", "req-u", message="Time one import")["runId"]
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/use-1/")
    cost = page.locator("#usage-rollup [data-field=cost]")
    assert cost.inner_text() == "$0.0000 · $0.0000"
    runner.emit("use-1", _usage(0.25))
    runner.emit(child, _usage(0.5))  # a descendant's usage: never in this page's stream
    page.wait_for_selector('#usage-rollup [data-field=cost]:text-is("$0.2500 · $0.7500")')
    assert page.inner_text("#usage-rollup [data-field=tokens-in]") == "100 · 200"


def test_it_shows_the_selected_run_beside_the_tree_named_in_the_url_with_row_actions(
    server, runner, browser, operator
):
    runner.open("split-1", message="Plan the migration")
    first = runner.child("split-1", "req-s1", message="List the tables")["runId"]
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/split-1/?run={first}")
    pane = page.locator("#run-detail")
    page.wait_for_selector(f'#run-detail[data-run-id="{first}"]')
    assert pane.locator("[data-role=task]").inner_text() == "List the tables"
    # The keyboard moves the selection; the pane and the URL follow.
    page.locator("#tree").focus()
    page.keyboard.press("k")
    page.wait_for_selector('#run-detail[data-run-id="split-1"]')
    assert "run=split-1" in page.url
    assert pane.locator("[data-role=task]").inner_text() == "Plan the migration"
    page.keyboard.press("j")
    page.wait_for_selector(f'#run-detail[data-run-id="{first}"]')
    # Row actions: steer, then cancel, from the pane.
    pane.locator("textarea[name=message]").fill("Only the big ones")
    pane.locator("[data-action=row-steer]").click()
    page.wait_for_selector('#run-detail [data-role=action-outcome]:text("Steer injected")')
    # The runner got it: its answer (emitted after it recorded the steer) shows in the tree.
    page.wait_for_selector("#tree >> text=Steered: I was told 'Only the big ones'")
    assert runner.steers[-1]["message"] == "Only the big ones"
    page.on("dialog", lambda dialog: dialog.accept())
    pane.locator("[data-action=row-cancel]").click()
    page.wait_for_selector('#run-detail [data-role=action-outcome]:text("Cancel")')

    def cancelled() -> bool:
        return any(
            c["method"] == "run.cancel" and c["params"]["runId"] == first for c in runner.commands
        )

    for _ in range(100):  # the command reaches the runner just after the REST answer
        if cancelled():
            break
        page.wait_for_timeout(100)
    assert cancelled()
    page.screenshot(path=str(screenshot_name("split-pane")))
    # The timeline beside it: lanes named by task, a tooltip naming the run, a legend.
    page.click("[data-tab=timeline]")
    canvas = page.locator("#timeline-canvas")
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + 60, box["y"] + AXIS_PX + 8)  # the first lane: the root
    page.wait_for_selector('#timeline-canvas[data-hover="split-1"]')
    assert canvas.get_attribute("title").startswith("Plan the migration\nsplit-1 · worker · ")
    legend = page.inner_text("[data-role=timeline-legend]")
    assert all(s in legend for s in ("running", "succeeded", "failed", "cancelled", "lost"))
    page.screenshot(path=str(screenshot_name("timeline")))

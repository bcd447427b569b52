"""The run page's fork-from-here form and pause/resume buttons (SPEC §14, issue 37), in
Chromium: an operator picks a finished run's step and forks it with a new message, lands on the
fork's page that says where it came from, compares it beside the original; pauses a live run
and resumes it. Each goes through the audited services REST uses."""

from __future__ import annotations

import pytest

from tests.support.browser import needs_chromium, screenshot_name, sign_in
from tests.support.personas import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(120)]


def test_an_operator_forks_a_run_from_a_step_and_pauses_another(server, runner, browser, operator):
    from delegation.models import AuditEntry, ExtensionPreset, Run

    # The scripted runner's presets are not agents that fork; this one stands for Claude Code.
    ExtensionPreset.objects.filter(name="worker").update(can_fork=True)
    runner.open("orig-1", message="Find the flaky test")
    runner.emit(
        "orig-1",
        {"kind": "session", "text": "started", "input": {"sessionId": "sess-1"}},
        {"kind": "text", "text": "looking at CI logs"},
        {"kind": "text", "text": "it is test_timeouts"},
    )
    runner.finish("orig-1", output="it is test_timeouts")

    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/orig-1/?fork_at=2")
    assert page.input_value("#fork-sequence") == "2"
    page.fill("#fork-message", "   ")
    with page.expect_navigation():
        page.click("[data-action=fork]")
    assert "new instruction" in page.inner_text(
        '#fork [data-role=field-error][data-field="message"]'
    )
    assert page.input_value("#fork-sequence") == "2"
    page.fill("#fork-message", "Now fix it")
    with page.expect_navigation():
        page.click("[data-action=fork]")
    fork = Run.objects.get(forked_from__run_id="orig-1")
    assert page.url.endswith(f"/runs/{fork.run_id}/")
    assert fork.forked_from_sequence == 2 and fork.request["message"] == "Now fix it"
    said = page.inner_text("#fork [data-role=forked-from]")
    assert "Forked from" in said and "Find the flaky test" in said and "at step 2" in said
    execute = next(
        c["params"]
        for c in runner.commands
        if c["method"] == "run.execute" and c["params"]["identity"]["runId"] == fork.run_id
    )
    assert execute["forkFrom"]["sessionId"] == "sess-1"
    page.screenshot(path=str(screenshot_name("fork-from-here")), full_page=True)
    with page.expect_navigation():
        page.click("[data-action=compare-fork]")
    assert "fork of the other at step 2" in page.inner_text("[data-role=fork-relation]")
    page.goto(f"{server.http_url}/runs/orig-1/")
    assert fork.run_id in page.inner_text("#fork [data-role=forks]")

    runner.open("live-1", message="Keep working")
    page.goto(f"{server.http_url}/runs/live-1/")
    with page.expect_navigation():
        page.click("[data-action=pause]")
    assert page.inner_text("#run [data-role=status]") == "paused"
    assert Run.objects.get(run_id="live-1").status == "paused"
    with page.expect_navigation():
        page.click("[data-action=resume]")
    assert page.inner_text("#run [data-role=status]") == "running"
    assert page.locator("[data-action=pause]").count() == 1
    actions = set(AuditEntry.objects.values_list("action", flat=True))
    assert {"pause", "resume", "launch"} <= actions
    # No reason typed: the audit says who, from where.
    reasons = dict(AuditEntry.objects.filter(target_id="live-1").values_list("action", "reason"))
    by = f"from the dashboard by {operator.username}"
    assert (reasons["pause"], reasons["resume"]) == (f"paused {by}", f"resumed {by}")


def test_an_operator_pauses_and_resumes_a_subtree_from_the_trees_side_pane(
    server, runner, browser, operator
):
    from delegation.models import Run

    runner.open("pane-1", message="Refactor the parser")
    child = runner.child("pane-1", "pane-req-1", message="Rename the tokens")["runId"]
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/pane-1/?run=pane-1")
    pane = page.locator('#run-detail[data-run-id="pane-1"][data-status=running]')
    pane.wait_for()
    # Running: Pause, no Resume.
    assert pane.locator("[data-action=row-pause]").is_visible()
    assert not pane.locator("[data-action=row-resume]").is_visible()
    pane.locator("[data-action=row-pause]").click()
    page.wait_for_selector('#run-detail[data-run-id="pane-1"][data-status=paused]')
    assert page.inner_text("#run-detail [data-role=action-outcome]") == "Pause paused."
    assert {r.status for r in Run.objects.filter(run_id__in=["pane-1", child])} == {"paused"}
    # Paused: Resume and Cancel, neither Pause nor Steer.
    assert page.locator("#run-detail [data-action=row-resume]").is_visible()
    assert not page.locator("#run-detail [data-action=row-pause]").is_visible()
    assert not page.locator("#run-detail [data-action=row-steer]").is_visible()
    assert page.locator("#run-detail [data-action=row-cancel]").is_visible()
    page.locator("#run-detail [data-action=row-resume]").click()
    page.wait_for_selector('#run-detail[data-run-id="pane-1"][data-status=running]')
    assert {r.status for r in Run.objects.filter(run_id__in=["pane-1", child])} == {"running"}

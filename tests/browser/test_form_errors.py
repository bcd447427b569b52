"""Errors keep what was typed (issue 38), in Chromium: the run page's budget, relaunch and
compare forms and the alerts page's webhook form come back with the input and the error
next to its field (not an error card with only "Back to trees"); an empty relaunch message
and an empty policy are refused in words; NUL is refused by every form as REST refuses it."""

from __future__ import annotations

import json

import pytest

from tests.support.browser import needs_chromium, screenshot_name, sign_in
from tests.support.personas import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(120)]


def test_it_keeps_the_run_pages_input_with_the_error_beside_the_field(
    server, runner, browser, operator, operator_token
):
    from delegation.models import ApprovalPolicy, Budget, Run

    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    launched = page.request.post(
        f"{server.http_url}/api/runs",
        headers={"Authorization": f"Bearer {operator_token}"},
        data={"runner": "runner-b", "profile": "worker", "message": "Count the TODOs"},
    )
    assert launched.status == 201, launched.text()
    run_id = launched.json()["runId"]
    page.goto(f"{server.http_url}/runs/{run_id}/")

    # Budget: a limit over REST's bound comes back beside its field, the rest kept.
    page.fill('#budget-form input[name="maxRuns"]', "10000000000000000")
    page.fill('#budget-form input[name="maxLive"]', "3")
    page.fill('#budget-form input[name="reason"]', "keep it small")
    with page.expect_navigation():
        page.click("[data-action=set-budget]")
    error = page.locator('#budget-form [data-role=field-error][data-field="maxRuns"]')
    assert "maxRuns" in error.inner_text() and "less than or equal" in error.inner_text()
    assert page.input_value('#budget-form input[name="maxRuns"]') == "10000000000000000"
    assert page.input_value('#budget-form input[name="maxLive"]') == "3"
    assert page.input_value('#budget-form input[name="reason"]') == "keep it small"
    assert page.locator("h1 [data-role=task]").inner_text() == "Count the TODOs"
    assert not Budget.objects.filter(run__run_id=run_id).exists()
    page.screenshot(path=str(screenshot_name("form-errors-budget")), full_page=True)

    # Relaunch: an empty message is refused in words, not a silent rerun of the original.
    page.fill("#relaunch-message", "   ")
    with page.expect_navigation():
        page.click("[data-action=relaunch]")
    error = page.locator('#relaunch [data-role=field-error][data-field="message"]')
    assert "write the task" in error.inner_text()
    assert Run.objects.filter(relaunched_from__run_id=run_id).count() == 0

    # Compare: an unknown run comes back beside the box, as typed.
    page.fill("#compare-form input[name=with]", "r-nope")
    with page.expect_navigation():
        page.click("[data-action=compare]")
    assert page.input_value("#compare-form input[name=with]") == "r-nope"
    assert "no run 'r-nope'" in page.inner_text("#compare-form [data-role=field-error]")

    # Policy: an empty box is refused, nothing is saved.
    page.fill("#policy-form [name=policy]", "")
    page.click("#policy-form [data-action=save-policy]")
    outcome = page.locator("#policy-form [data-role=policy-outcome]")
    page.wait_for_function(
        "() => document.querySelector('#policy-form [data-role=policy-outcome]').textContent"
    )
    assert "empty" in outcome.inner_text() and "saved" not in outcome.inner_text()
    assert not ApprovalPolicy.objects.filter(run__run_id=run_id).exists()
    # The hint's example is JSON a person can paste.
    hint = page.inner_text("#policy-form [data-role=policy-hint] code >> nth=0")
    assert json.loads(hint)["default"] == "ask"


def test_it_refuses_nul_in_browser_forms_as_rest_does(server, runner, browser, operator):
    runner.open("nul-1", message="Hold on")
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/nul-1/")
    for path, data in (
        ("/runs/nul-1/budget/", {"maxLive": "2", "reason": "a\x00b"}),
        ("/runs/nul-1/cancel/", {"reason": "a\x00b"}),
        ("/runs/nul-1/pause/", {"reason": "a\x00b"}),
        ("/runs/nul-1/resume/", {"reason": "a\x00b"}),
    ):
        token = page.input_value("#budget-form [name=csrfmiddlewaretoken]")
        answer = page.request.post(
            f"{server.http_url}{path}", form={**data, "csrfmiddlewaretoken": token}
        )
        assert answer.status == 422, (path, answer.status)
        assert "must not contain NUL" in answer.text()
    # The launch form shows the refusal on the form, with what was typed.
    page.goto(f"{server.http_url}/launch/")
    token = page.input_value("form [name=csrfmiddlewaretoken]")
    answer = page.request.post(
        f"{server.http_url}/launch/",
        form={
            "runner": "runner-b",
            "preset": "ext/worker",
            "message": "count\x00words",
            "csrfmiddlewaretoken": token,
        },
    )
    assert answer.status == 422, answer.status
    assert "message: must not contain NUL" in answer.text()
    from delegation.models import Run

    assert Run.objects.get(run_id="nul-1").cancel_requested_at is None
    assert Run.objects.count() == 1  # nothing launched


def test_it_keeps_the_webhook_form_with_the_error_beside_the_url(server, browser, admin):
    page = browser()
    sign_in(page, server.http_url, admin.username, PASSWORD)
    page.goto(f"{server.http_url}/alerts/")
    page.fill("#webhook-name", "pager")
    page.fill("#webhook-url", "ftp://example.com/hook")
    page.uncheck("#webhook-form input[name=kinds] >> nth=0")
    with page.expect_navigation():
        page.click("[data-action=add-webhook]")
    assert page.input_value("#webhook-name") == "pager"
    assert page.input_value("#webhook-url") == "ftp://example.com/hook"
    assert not page.is_checked("#webhook-form input[name=kinds] >> nth=0")
    assert page.locator('#webhook-form [data-role=field-error][data-field="url"]').is_visible()
    assert page.locator("#webhooks tr[data-webhook]").count() == 0


def test_it_turns_a_webhook_off_and_on_and_deletes_it_from_the_alerts_page(server, browser, admin):
    from delegation.models import AuditEntry, Webhook

    page = browser()
    sign_in(page, server.http_url, admin.username, PASSWORD)
    page.goto(f"{server.http_url}/alerts/")
    page.fill("#webhook-name", "pager")
    page.fill("#webhook-url", "http://127.0.0.1:9/hook")
    with page.expect_navigation():
        page.click("[data-action=add-webhook]")
    hook = Webhook.objects.get(name="pager")
    row = page.locator(f"#webhooks tr[data-webhook='{hook.pk}']")
    with page.expect_navigation():
        row.locator("[data-action=disable]").click()
    hook.refresh_from_db()
    assert hook.active is False and row.locator(".chip").inner_text() == "off"
    with page.expect_navigation():
        row.locator("[data-action=enable]").click()
    hook.refresh_from_db()
    assert hook.active is True
    with page.expect_navigation():
        row.locator("[data-action=delete-webhook]").click()
    assert not Webhook.objects.filter(pk=hook.pk).exists()
    assert page.locator("#webhooks tr[data-webhook]").count() == 0
    actions = set(AuditEntry.objects.values_list("action", flat=True))
    assert {"webhook-create", "webhook-update", "webhook-delete"} <= actions

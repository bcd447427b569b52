"""Friendly error pages (issue 25): a refused, missing or failed page is a card in the
dashboard's style that says what happened and offers a way back, never a bare status line.
Each page is saved as a screenshot under test-results/ (a CI artifact)."""

from __future__ import annotations

import logging

import pytest
from django.test import RequestFactory
from django.views import defaults

from delegation.logfilters import OrdinaryEvents
from tests.support.browser import needs_chromium, screenshot_name, sign_in
from tests.support.personas import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(120)]
# The module's server sweeps webhook deliveries every second (the alerts page's test).
DAPHNE_ENV = {"MAINTENANCE_INTERVAL_SECONDS": "1"}


def _card(page) -> dict:
    card = page.wait_for_selector("[data-error-page]")
    return {
        "status": card.get_attribute("data-error-page"),
        "heading": page.inner_text("[data-error-page] h1"),
        "text": page.inner_text("[data-error-page] .refusal"),
        "back": page.get_attribute("[data-error-page] a.btn", "href"),
        "styled": page.eval_on_selector(
            "[data-error-page]", "e => getComputedStyle(e).borderRadius"
        ),
    }


def test_it_shows_missing_refused_and_expired_pages_in_the_dashboard_style(
    server, browser, viewer, outsider
):
    page = browser()
    sign_in(page, server.http_url, viewer.username, PASSWORD)
    answer = page.goto(f"{server.http_url}/runs/no-such-run/")
    assert answer.status == 404
    card = _card(page)
    assert card["heading"] == "Not found" and "/runs/no-such-run/" in card["text"]
    assert card["back"] == "/trees/" and card["styled"] == "8px"
    assert page.title() == "Not found · Canopy"
    page.screenshot(path=str(screenshot_name("error-404")))

    # A form whose CSRF token went stale: Django's CSRF page, in the dashboard's style.
    page.goto(f"{server.http_url}/trees/")
    page.context.clear_cookies(name="csrftoken")
    page.evaluate("document.querySelector('input[name=csrfmiddlewaretoken]').value = 'stale'")
    with page.expect_navigation():
        page.click("[data-action=sign-out]")
    card = _card(page)
    assert card["status"] == "403" and card["heading"] == "This form has expired"
    page.screenshot(path=str(screenshot_name("error-403-csrf")))

    refused = browser()
    sign_in(refused, server.http_url, outsider.username, PASSWORD)
    card = _card(refused)
    assert card["status"] == "403" and card["heading"] == "Not allowed"
    assert "has no role in Canopy" in card["text"]
    refused.screenshot(path=str(screenshot_name("error-403")))


def test_it_renders_the_500_page_without_a_request_context():
    # Django renders 500.html with no request (the failure may be in what a request needs).
    response = defaults.server_error(RequestFactory().get("/boom/"))
    html = response.content.decode()
    assert response.status_code == 500
    assert 'data-error-page="500"' in html and "Something went wrong on the server" in html
    assert "canopy.css" in html and "Sign in as someone else" not in html


def test_it_logs_an_ordinary_event_as_one_line_and_a_bug_with_its_traceback(caplog):
    logger = logging.getLogger("tests.ordinary")
    handler = logging.StreamHandler()
    handler.addFilter(OrdinaryEvents())
    lines = []
    handler.emit = lambda record: lines.append(handler.format(record))
    logger.addHandler(handler)
    try:
        try:
            raise PermissionError("nope")
        except PermissionError:
            logger.warning(
                "Forbidden (Permission denied): /x", exc_info=True, extra={"status_code": 403}
            )
        try:
            raise ConnectionResetError("peer went away")
        except ConnectionResetError:
            logger.exception("live catch-up failed")
        try:
            raise KeyError("bug")
        except KeyError:
            logger.exception("REST API error")
    finally:
        logger.removeHandler(handler)
    assert lines[0] == "Forbidden (Permission denied): /x (PermissionError: nope)"
    assert lines[1] == "live catch-up failed (ConnectionResetError: peer went away)"
    assert lines[2].startswith("REST API error\nTraceback")


def test_it_gives_admins_an_alerts_page_to_add_a_webhook_send_a_test_and_see_attempts(
    server, browser, admin, operator
):
    from tests.support.webhook_receiver import Receiver

    with Receiver(statuses=(500,)) as receiver:
        page = browser()
        sign_in(page, server.http_url, admin.username, PASSWORD)
        page.click("nav >> text=Alerts")
        page.fill("#webhook-name", "pager")
        page.fill("#webhook-url", receiver.url)
        with page.expect_navigation():
            page.click("[data-action=add-webhook]")
        assert "signing secret (shown once)" in page.inner_text(".flash-stack")
        with page.expect_navigation():
            page.click("[data-action=send-test]")
        assert "Test delivery" in page.inner_text(".flash-stack")
        # The server's upkeep loop sends it (every second here); the receiver answers 500.
        receiver.wait_for(1)
        row = page.locator("#deliveries tr[data-delivery]")
        for _ in range(50):  # the attempt is logged right after the answer: reload until then
            page.reload()
            if row.locator("[data-attempt]").count():
                break
        assert row.get_attribute("data-state") == "pending"
        assert "#1" in row.inner_text() and "HTTP 500" in row.inner_text()
        page.screenshot(path=str(screenshot_name("alerts")), full_page=True)
    # An operator is refused the page, in the dashboard's style.
    other = browser()
    sign_in(other, server.http_url, operator.username, PASSWORD)
    assert other.locator("nav >> text=Alerts").count() == 0
    assert other.goto(f"{server.http_url}/alerts/").status == 403
    assert "need admin" in other.inner_text("[data-error-page] .refusal")

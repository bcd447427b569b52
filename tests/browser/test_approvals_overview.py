"""Pending approvals among the overview's headline numbers (issue 25 item 3, SPEC §11): the
number equals what REST lists as pending, and follows requests and decisions without a
reload."""

from __future__ import annotations

import pytest

from tests.support.browser import needs_chromium, sign_in
from tests.support.personas import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(120)]

SHOWN = "[data-stat=pendingApprovals] [data-role=value]"


def _ask(runner, run_id: str, call: str) -> dict:
    params = {"runId": run_id, "toolCallId": call, "toolName": "Bash"}
    return runner.call("approval.request", {**params, "input": {"command": f"touch {call}"}})


def _rest_pending(page, base: str) -> list[dict]:
    answer = page.request.get(f"{base}/api/approvals?status=pending")
    assert answer.ok, answer.text()
    return answer.json()["items"]


def test_it_shows_the_pending_approvals_rest_counts_and_follows_them_live(
    server, runner, browser, operator
):
    runner.open("asks-a", message="Tidy the build")
    runner.open("asks-b", message="Rotate the logs")
    _ask(runner, "asks-a", "call-1")
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/")
    assert page.inner_text(SHOWN) == str(len(_rest_pending(page, server.http_url))) == "1"
    overview = page.request.get(f"{server.http_url}/api/overview").json()
    assert overview["pendingApprovals"] == 1

    _ask(runner, "asks-b", "call-2")
    page.wait_for_selector(f'{SHOWN}:text-is("2")', timeout=10_000)
    first = next(a for a in _rest_pending(page, server.http_url) if a["runId"] == "asks-a")
    decided = page.request.post(
        f"{server.http_url}/api/approvals/{first['approvalId']}/decision",
        data={"decision": "deny", "message": "not now"},
        headers={"X-CSRFToken": _csrf(page)},
    )
    assert decided.ok, decided.text()
    page.wait_for_selector(f'{SHOWN}:text-is("1")', timeout=10_000)
    assert len(_rest_pending(page, server.http_url)) == 1


def _csrf(page) -> str:
    return next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")

"""The approvals inbox follows the live socket's doorbell (SPEC §11, "live"), in Chromium: with
the page's safety poll made far longer than the test, a new approval appears in an open inbox
within 3 s and a decision another operator makes through REST removes it within 3 s, and the
page asks ``/api/approvals`` only when the doorbell rings (no once-a-second poll)."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlparse

import pytest

from tests.support.browser import needs_chromium, sign_in
from tests.support.personas import PASSWORD

pytestmark = [
    pytest.mark.django_db(transaction=True),
    needs_chromium,
    pytest.mark.timeout(120),
]

LIVE_MS = 3000


def test_it_shows_and_removes_an_approval_within_3_s_by_doorbell_without_polling(
    server, runner, browser, viewer, operator_token
):
    runner.open("live-inbox")
    page = browser()
    # The safety poll (30 s) must not be what shows the approval: ten minutes here.
    page.add_init_script("window.canopyApprovalsPollMs = 600000")
    lists: list[float] = []
    lock = threading.Lock()

    def on_request(request):
        if urlparse(request.url).path == "/api/approvals":
            with lock:
                lists.append(time.monotonic())

    page.on("request", on_request)
    sign_in(page, server.http_url, viewer.username, PASSWORD)
    page.goto(f"{server.http_url}/approvals/")
    page.wait_for_selector("#approvals [data-role=empty]")
    page.wait_for_function("() => window.canopyLive && window.canopyLive.hello !== null")
    # Settled: the load's fetch and the subscription's catch-up are done.
    page.wait_for_timeout(1500)
    settled = len(lists)
    assert settled >= 1
    page.wait_for_timeout(2500)
    assert len(lists) == settled, "the inbox still polls /api/approvals on its own"

    asked = runner.call(
        "approval.request",
        {
            "runId": "live-inbox",
            "toolCallId": "t-1",
            "toolName": "Bash",
            "input": {"command": "touch live"},
        },
    )
    assert asked["status"] == "pending"
    started = time.monotonic()
    selector = f"#approvals [data-approval-id='{asked['approvalId']}']"
    page.wait_for_selector(selector, timeout=LIVE_MS)
    assert time.monotonic() - started < LIVE_MS / 1000
    page.wait_for_selector("[data-role=approvals-count]:text-is('1')", timeout=LIVE_MS)
    page.wait_for_timeout(500)
    # One doorbell, one refetch (a second only if it was queued behind the first).
    assert 1 <= len(lists) - settled <= 2, lists
    rung = len(lists)

    decided = page.request.post(
        f"{server.http_url}/api/approvals/{asked['approvalId']}/decision",
        headers={"Authorization": f"Bearer {operator_token}"},
        data={"decision": "deny", "message": "not now"},
    )
    assert decided.status == 200, decided.text()
    started = time.monotonic()
    page.wait_for_selector(selector, state="detached", timeout=LIVE_MS)
    assert time.monotonic() - started < LIVE_MS / 1000
    page.wait_for_selector("#approvals [data-role=empty]:not([hidden])", timeout=LIVE_MS)
    assert page.text_content("[data-role=approvals-count]") == "0"
    page.wait_for_timeout(500)
    assert 1 <= len(lists) - rung <= 2, lists

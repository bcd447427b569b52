"""Finding 13: every page works under the Content-Security-Policy in a real browser."""

from __future__ import annotations

import pytest

from delegation.services import tokens
from tests.support.browser import ScriptedRunner, launch, needs_chromium, sign_in
from tests.support.personas import PASSWORD

pytestmark = [
    pytest.mark.django_db(transaction=True),
    needs_chromium,
    pytest.mark.timeout(180),
]


def test_it_loads_every_page_with_no_content_security_policy_violation(
    admin,
    daphne_factory,
    allow_orm_from_playwright,
):
    from playwright.sync_api import sync_playwright

    server = daphne_factory(LIVE_HEARTBEAT_SECONDS="1")
    _runner, token = tokens.create_runner("csp-runner")
    runner = ScriptedRunner(f"ws://127.0.0.1:{server.port}/ws/runner/", token).start()
    try:
        runner.open("root-1")
        runner.text("root-1", "hello")
        with sync_playwright() as playwright:
            browser = launch(playwright)
            page = browser.new_page()
            page.set_default_timeout(15000)
            console: list[str] = []
            page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
            policies = []
            page.on(
                "response",
                lambda r: (
                    policies.append(r.headers.get("content-security-policy"))
                    if r.request.resource_type == "document"
                    else None
                ),
            )
            sign_in(page, server.http_url, admin.username, PASSWORD)
            page.wait_for_selector("#live-state[data-state=live]")
            for path, ready in (
                ("/trees/root-1/", '#tree [data-run-id="root-1"]'),
                ("/runs/root-1/", '#events [data-sequence="1"]'),
                ("/runners/", "table"),
                ("/audit/", "table"),
                ("/leases/", "#leases-table"),  # issue 38's pages
                ("/approvals/", "#approvals"),
                ("/alerts/", "#webhooks"),
                ("/admin/", "#site-name"),
                ("/admin/delegation/run/", "#result_list"),
                ("/api/docs", ".swagger-ui .info"),
            ):
                page.goto(server.http_url + path)
                page.wait_for_selector(ready)
                page.wait_for_timeout(300)  # violations are reported asynchronously
            browser.close()
    finally:
        runner.close()
    assert policies and all(p and "script-src 'self'" in p for p in policies), policies
    violations = [line for line in console if "Content Security Policy" in line]
    assert violations == [], violations

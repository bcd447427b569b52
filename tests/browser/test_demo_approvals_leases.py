"""The offline demo shows an approval and a lease (issue 38), in Chromium: the scripted
engine (as ``make run`` configures it, here at rate 1) asks an operator before a shell command
and starts its children under a lease it keeps; the approval waits in the inbox, named by its
run's task, and runs as edited; the lease is listed on the leases page (filtered by runner
and state), held by the task's run, and released from there."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import pytest

from delegation.runner.host import RunnerHost
from delegation.runner.scripted import ScriptedConfig, ScriptedEngine
from delegation.services import tokens
from tests.support.browser import needs_chromium, screenshot_name, sign_in
from tests.support.personas import PASSWORD
from tests.support.runners import FAST

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(150)]


def _serve_scripted(server, token, stop: threading.Event, shared: dict):
    config = ScriptedConfig(
        pace=0.05, steps=1, fanout=1, depth=1, poll=0.05, approval_rate=1.0, lease_rate=1.0
    )

    async def drive():
        async with RunnerHost(server.ws_url, token, ScriptedEngine(config), client_options=FAST):
            shared["up"] = True
            while not stop.is_set():
                await asyncio.sleep(0.05)

    try:
        asyncio.run(drive())
    except BaseException as exc:  # shown by the test's assertions
        shared["error"] = repr(exc)


def _allow(page, run_task: str, edit: dict | None = None):
    named = page.locator("[data-field=task]", has_text=re.compile(f"^{re.escape(run_task)}$"))
    card = page.locator("#approvals [data-approval-id]", has=named)
    card.locator("[data-action=allow]").wait_for(timeout=20000)
    assert card.locator("[data-field=description]").inner_text().startswith("Run the tests for")
    if edit is None:
        card.locator("[data-action=allow]").click()
    else:
        card.locator("[data-action=edit]").click()
        card.locator("[name=updatedInput]").fill(json.dumps(edit))
        card.locator("[data-action=edit]").click()
    card.locator("[data-role=outcome]:has-text('allow by operator:')").wait_for()


def test_it_shows_the_scripted_demos_approval_and_lease_and_releases_it(
    server, browser, operator, operator_token
):
    from delegation.models import Event, Lease, Run

    _runner, token = tokens.create_runner("demo-runner")
    stop, shared = threading.Event(), {}
    thread = threading.Thread(target=_serve_scripted, args=(server, token, stop, shared))
    thread.start()
    try:
        page = browser()
        sign_in(page, server.http_url, operator.username, PASSWORD)
        deadline = time.monotonic() + 20
        while True:
            launched = page.request.post(
                f"{server.http_url}/api/runs",
                headers={"Authorization": f"Bearer {operator_token}"},
                data={"runner": "demo-runner", "profile": "planner", "message": "Ship the notes"},
            )
            if launched.status == 201 or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # the runner is still connecting
        assert launched.status == 201, (launched.text(), shared)
        root = launched.json()["runId"]

        page.goto(f"{server.http_url}/approvals/")
        _allow(page, "Ship the notes", edit={"command": "pytest -q tests/unit"})
        # Its child asks too, under the lease its parent holds.
        child_task = Run.objects.filter(parent__run_id=root).values_list("task", flat=True)
        deadline = time.monotonic() + 20
        while not child_task.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        _allow(page, child_task.first())

        deadline = time.monotonic() + 30
        while not Run.objects.get(run_id=root).done and time.monotonic() < deadline:
            time.sleep(0.1)
        assert Run.objects.get(run_id=root).status == "succeeded", shared
        ran = Event.objects.get(run__run_id=root, kind="tool-use", tool_name="Bash")
        assert ran.input == {"command": "pytest -q tests/unit"}  # the edited command ran

        # The lease outlives its holder's run: listed live, then released from the page.
        lease = Lease.objects.get(parent_run__run_id=root)
        page.goto(f"{server.http_url}/leases/?runner=demo-runner&state=live")
        row = page.locator(f"#leases-table tr[data-lease='{lease.pk}']")
        assert row.get_attribute("data-state") == "live"
        assert row.locator("[data-role=holder]").inner_text() == "Ship the notes"
        page.screenshot(path=str(screenshot_name("demo-leases")), full_page=True)
        with page.expect_navigation():
            row.locator("[data-action=release]").click()
        assert "/leases/" in page.url
        lease.refresh_from_db()
        assert lease.state == "released"
        page.goto(f"{server.http_url}/leases/?state=released")
        assert page.locator(f"#leases-table tr[data-lease='{lease.pk}']").count() == 1
        page.goto(f"{server.http_url}/leases/?state=live")
        assert page.locator(f"#leases-table tr[data-lease='{lease.pk}']").count() == 0
    finally:
        stop.set()
        thread.join(15)
    assert "error" not in shared, shared

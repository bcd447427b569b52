"""Launching a tree from the dashboard in Chromium: the "New run" form starts a run on the
reference runner's scripted engine (a real ``manage.py runner`` process) and the tree grows
live; a viewer gets no form, and a forged POST from a viewer's session is refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from delegation.models import AuditEntry, Budget, Run, Runner, RunVia
from delegation.services import tokens
from tests.support.browser import needs_chromium, sign_in
from tests.support.paths import PROJECT as BASE_DIR
from tests.support.personas import PASSWORD

pytestmark = [
    pytest.mark.django_db(transaction=True),
    needs_chromium,
    pytest.mark.timeout(180),
    # A server of each test's own (the folder conftest's ``server``), with this heartbeat.
    pytest.mark.own_server,
]
DAPHNE_ENV = {"LIVE_HEARTBEAT_SECONDS": "1"}
PAGE_TIMEOUT_MS = 20000


@pytest.fixture
def scripted_runner(server):
    """The reference runner (scripted engine) as its own process, connected to ``server``."""
    _runner, token = tokens.create_runner("demo-b")
    env = {**os.environ, "CANOPY_RUNNER_TOKEN": token}
    env.pop("PANDO_DELEGATION_DEPTH", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "runner",
            "--url",
            server.ws_url,
            "--engine",
            "scripted",
            "--pace",
            "0.3",
            "--steps",
            "1",
            "--fanout",
            "2",
            "--levels",
            "2",
        ],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield process
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def _wait_connected(timeout: float = 30.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Runner.objects.filter(name="demo-b", connected=True).exists():
            return
        time.sleep(0.1)
    raise AssertionError("the scripted runner never connected")


def test_it_launches_a_tree_from_the_form_and_watches_it_grow(
    server, scripted_runner, browser, operator
):
    _wait_connected()
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/")
    page.click("#new-run")
    page.wait_for_selector("#launch-form")
    page.select_option("#launch-form select[name=runner]", "demo-b")
    page.select_option("#launch-form select[name=preset]", "reference-runner/planner")
    page.fill("#launch-form textarea[name=message]", "Ship the release notes")
    page.fill("#launch-form input[name=maxRuns]", "20")
    page.fill("#launch-form input[name=maxCostUsd]", "5")
    page.click("#launch-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/trees/r-[0-9a-f]+/"))
    run_id = page.url.rstrip("/").rsplit("/", 1)[-1]
    # The root, then its children appear live as the scripted agent delegates.
    page.wait_for_selector(f'#tree [data-run-id="{run_id}"]')
    page.wait_for_function(
        "() => document.querySelectorAll('#tree [data-run-id]').length >= 3", timeout=30000
    )
    page.wait_for_selector(
        f'#tree [data-run-id="{run_id}"][data-status="succeeded"]', timeout=60000
    )
    root = Run.objects.get(run_id=run_id)
    assert (root.depth, root.via, root.profile) == (0, RunVia.LAUNCH, "planner")
    assert Run.objects.filter(root=root, depth=1).count() == 2
    assert AuditEntry.objects.filter(action="launch", target_id=run_id, outcome="launched").exists()
    assert Budget.objects.get(run=root).max_runs == 20


def test_it_shows_the_refusal_on_the_form(server, browser, operator):
    tokens.create_runner("demo-b")  # known, never connected
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/launch/")
    # No connected runner: the select offers nothing, so post what a stale page would.
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(
        f"{server.http_url}/launch/",
        form={"runner": "demo-b", "preset": "reference-runner/planner", "message": "x"},
        headers={"X-CSRFToken": csrf, "Referer": f"{server.http_url}/launch/"},
    )
    assert response.status == 409
    assert "not connected" in response.text()
    assert Run.objects.count() == 0


def test_it_gives_a_viewer_no_form_and_refuses_a_forged_post(
    server, scripted_runner, browser, viewer
):
    _wait_connected()
    page = browser()
    sign_in(page, server.http_url, viewer.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/")
    assert page.locator("#new-run").count() == 0
    response = page.goto(f"{server.http_url}/launch/")
    assert response.status == 403
    assert page.locator("#launch-form").count() == 0
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    forged = page.request.post(
        f"{server.http_url}/launch/",
        form={"runner": "demo-b", "preset": "reference-runner/planner", "message": "x"},
        headers={"X-CSRFToken": csrf, "Referer": f"{server.http_url}/launch/"},
    )
    assert forged.status == 403
    assert Run.objects.count() == 0
    assert AuditEntry.objects.filter(
        action="launch", outcome="refused: not an operator", actor=f"user:{viewer.username}"
    ).exists()

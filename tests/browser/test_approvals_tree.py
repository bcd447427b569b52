"""Pending approvals on the tree page's rows (SPEC §11): each row shows what waits on the run
and in its subtree, live as approvals are requested and decided; an operator allows or denies
(with a message) from the row through the REST decision; a viewer sees no buttons."""

from __future__ import annotations

import pytest

from tests.support.browser import needs_chromium, sign_in
from tests.support.personas import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True), needs_chromium, pytest.mark.timeout(120)]


def _ask(runner, run_id: str, call: str) -> dict:
    params = {"runId": run_id, "toolCallId": call, "toolName": "Bash"}
    return runner.call("approval.request", {**params, "input": {"command": f"touch {call}"}})


def _mark(run_id: str, own: int, sub: int) -> str:
    return (
        f'#tree .trow[data-run-id="{run_id}"] [data-role=approvals]'
        f'[data-pending="{own}"][data-sub-pending="{sub}"]'
    )


def _rest(page, base: str, run_id: str) -> list[dict]:
    answer = page.request.get(f"{base}/api/approvals?run={run_id}")
    assert answer.ok, answer.text()
    return answer.json()["items"]


def test_it_counts_pending_approvals_per_subtree_and_decides_from_a_row(
    server, runner, browser, operator, viewer
):
    runner.open("tree-top", message="Ship the release")
    child = runner.child("tree-top", "req-1", message="Run the migrations")["runId"]
    _ask(runner, child, "call-1")
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/tree-top/")
    page.wait_for_selector(_mark("tree-top", 0, 1), timeout=30_000)
    page.wait_for_selector(_mark(child, 1, 1))

    # Live: a request on the top run moves its own count and its subtree's.
    _ask(runner, "tree-top", "call-2")
    page.wait_for_selector(_mark("tree-top", 1, 2), timeout=10_000)

    watcher = browser()
    sign_in(watcher, server.http_url, viewer.username, PASSWORD)
    watcher.goto(f"{server.http_url}/trees/tree-top/")
    watcher.wait_for_selector(_mark(child, 1, 1), timeout=30_000)
    assert watcher.query_selector("#tree [data-approval-action]") is None

    page.once("dialog", lambda dialog: dialog.accept("not on a Friday"))
    page.click(f'#tree .trow[data-run-id="{child}"] [data-approval-action=deny]')
    page.wait_for_selector(f"#tree .trow[data-run-id='{child}']:not(:has([data-role=approvals]))")
    page.wait_for_selector(_mark("tree-top", 1, 1), timeout=10_000)
    (denied,) = _rest(page, server.http_url, child)
    assert (denied["decision"], denied["message"]) == ("deny", "not on a Friday"), denied
    assert any(c["params"].get("decision") == "deny" for c in _decided(runner, child))

    page.click('#tree .trow[data-run-id="tree-top"] [data-approval-action=allow]')
    page.wait_for_selector("#tree .trow[data-run-id='tree-top']:not(:has([data-role=approvals]))")
    (allowed,) = _rest(page, server.http_url, "tree-top")
    assert allowed["decision"] == "allow", allowed


def _decided(runner, run_id: str) -> list[dict]:
    return [
        c
        for c in runner.commands
        if c["method"] == "approval.decided" and c["params"]["runId"] == run_id
    ]

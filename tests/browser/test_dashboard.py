"""The dashboard in a real browser (Debian's chromium through Playwright) against a live daphne
process, with a runner connected over a real WebSocket.

On failure each page is saved as a screenshot under test-results/.
"""

from __future__ import annotations

import re

import pytest

from delegation.models import AuditEntry, Event, Lease, Run
from delegation.protocol import MAX_STEER_BYTES
from delegation.services import tokens
from tests.support.browser import (
    ScriptedRunner,
    needs_chromium,
    sequences,
    sign_in,
    wait_status,
)
from tests.support.personas import PASSWORD

pytestmark = [
    pytest.mark.django_db(transaction=True),
    needs_chromium,
    pytest.mark.timeout(180),
]


# The module's shared server (tests.support.live_server.daphne_server) runs with these.
DAPHNE_ENV = {"LIVE_HEARTBEAT_SECONDS": "1"}


# The cancel report's last cells whose content (chip, "stopped after …") is cut by the cell, or
# whose cell reaches past the report's card without a sideways scroll to reach it.
_CLIPPED_REPORT_CELLS = """() => {
  const card = document.getElementById('cancel-report');
  const scroller = card.querySelector('.report-scroll') || card;
  const edge = card.getBoundingClientRect().right;
  const scrolls = scroller.scrollWidth > scroller.clientWidth && getComputedStyle(scroller).overflowX === 'auto';
  return [...card.querySelectorAll('tbody tr')].flatMap((row) => {
    const cell = row.lastElementChild, c = cell.getBoundingClientRect();
    const cut = cell.scrollWidth > cell.clientWidth + 1;
    return cut || (c.right > edge + 0.5 && !scrolls) ? [row.dataset.reportRun] : [];
  });
}"""


def test_it_signs_in_watches_a_tree_grow_and_a_run_stream_live(server, runner, browser, operator):
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.wait_for_selector("#live-state[data-state=live]")
    runner.open("root-1")
    # The overview inserts the new tree live.
    page.wait_for_selector('#trees-table tr[data-run-id="root-1"]')
    page.click('a[href="/trees/root-1/"]')
    page.wait_for_selector('#tree [data-run-id="root-1"]')
    children = [runner.child("root-1", f"req-{i}", f"task {i}")["runId"] for i in range(3)]
    for child in children:
        page.wait_for_selector(f'#tree [data-run-id="{child}"][data-status="running"]')
    grandchild = runner.child(children[0], "deep", "deeper")["runId"]
    page.wait_for_selector(f'#tree [data-run-id="{grandchild}"]')
    runner.finish(children[2], output="all done")
    wait_status(page, children[2], "succeeded", "#tree")
    assert page.text_content("#tree-stats [data-role=total]") == "5"
    # Keyboard: j moves down to the first child, Enter opens it.
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(f".*/runs/{children[0]}/"))
    page.wait_for_selector('#events [data-sequence="1"]')  # "started: task 0"
    for n in range(2, 7):
        runner.text(children[0], f"step {n}")
    runner.emit(
        children[0],
        {"kind": "tool-use", "toolName": "grep", "input": {"pattern": "TODO"}},
        {"kind": "tool-result", "toolName": "grep", "success": False, "toolOutput": "exit 2"},
        {"kind": "error", "error": "provider rate limited"},
    )
    page.wait_for_selector('#events [data-sequence="9"]')
    assert sequences(page) == list(range(1, 10))
    assert page.text_content('#events [data-sequence="8"] .outcome') == "failure"
    assert "provider rate limited" in page.text_content('#events [data-sequence="9"]')


def test_it_steers_a_running_child_and_cancels_a_subtree(server, runner, browser, operator):
    runner.open("root-1")
    child = runner.child("root-1", "c1", "write the parser")["runId"]
    grandchildren = [runner.child(child, f"g{i}", f"part {i}")["runId"] for i in range(2)]
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/{child}/")
    page.wait_for_selector('#events [data-sequence="1"]')
    # A reload would drop this marker and replay the stream from the first event.
    page.evaluate("window.steerMarker = 'kept'")
    page.fill("#steer-message", "focus on the error paths")
    page.click("[data-action=steer]")
    outcome = page.wait_for_selector('#steer-outcome[data-outcome="injected"]')
    assert "Steer injected" in outcome.text_content()
    assert page.input_value("#steer-message") == ""
    steer = page.wait_for_selector('#events [data-kind="steer"]')
    assert steer.get_attribute("data-actor") == "user:olga"
    assert "focus on the error paths" in steer.text_content()
    reply = page.wait_for_selector('#events [data-kind="text"]:has-text("Steered: I was told")')
    assert int(reply.get_attribute("data-sequence")) > int(steer.get_attribute("data-sequence"))
    assert page.evaluate("window.steerMarker") == "kept"
    shown = sequences(page)
    assert shown == list(range(1, len(shown) + 1))
    # A refused steer is shown inline too, with the service's message, still without a reload.
    page.fill("#steer-message", "   ")
    page.click("[data-action=steer]")
    refused = page.wait_for_selector('#steer-outcome[data-outcome="refused"]')
    assert "Steer refused: message: must not be blank" in refused.text_content()
    assert page.evaluate("window.steerMarker") == "kept"
    assert Event.objects.filter(kind="steer").count() == 1

    # Cancel the subtree from the root: the confirmation counts every run that will stop.
    page.goto(f"{server.http_url}/runs/root-1/")
    page.wait_for_selector(f'#subtree [data-run-id="{grandchildren[1]}"]')
    page.click("[data-action=cancel-subtree]")
    message = page.text_content("#confirm-dialog [data-role=message]")
    assert "This will stop 4 runs: this run and 3 live descendants." in message
    page.fill("#confirm-dialog input[name=reason]", "runaway tree")
    page.click("#confirm-dialog [data-action=confirm]")
    page.wait_for_selector("#cancel-report")
    for run_id in ["root-1", child, *grandchildren]:
        page.wait_for_selector(
            f'#cancel-report [data-report-run="{run_id}"][data-status="cancelled"]'
        )
        wait_status(page, run_id, "cancelled", "#subtree")
    assert "stopped" in page.text_content(f'#cancel-report [data-report-run="{grandchildren[0]}"]')
    # The report's last column fits its chips (or scrolls), clipped at no width.
    for width in (1024, 1440):
        page.set_viewport_size({"width": width, "height": 800})
        clipped = page.evaluate(_CLIPPED_REPORT_CELLS)
        assert clipped == [], f"cancel report cells clipped at {width} px: {clipped}"
    assert Run.objects.filter(status="cancelled").count() == 4
    entry = AuditEntry.objects.get(action="cancel-subtree")
    assert entry.actor == "user:olga" and entry.reason == "runaway tree"
    assert AuditEntry.objects.get(action="steer").outcome == "injected"


def test_it_shows_on_the_run_page_a_steer_the_runner_did_not_deliver(
    server, runner, browser, operator
):
    runner.open("root-1")
    child = runner.child("root-1", "c1", "write the parser")["runId"]
    runner.steer_answer = {"outcome": "promptRequired", "reason": "turnEnded"}
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/{child}/")
    page.wait_for_selector('#events [data-sequence="1"]')
    page.fill("#steer-message", "too late")
    page.click("[data-action=steer]")
    page.wait_for_selector(".flash-success")
    assert page.get_attribute("#steer-message", "maxlength") == str(MAX_STEER_BYTES)
    refused = page.wait_for_selector('#events [data-kind="steer-undelivered"]')
    assert "was not delivered: promptRequired (turnEnded)" in refused.text_content()
    assert int(refused.get_attribute("data-sequence")) > int(
        page.get_attribute('#events [data-kind="steer"]', "data-sequence")
    )
    assert AuditEntry.objects.get(action="steer").outcome == "undelivered: promptRequired"


def test_it_shows_a_viewer_no_controls_and_refuses_a_forged_action(server, runner, browser, viewer):
    runner.open("root-1")
    child = runner.child("root-1", "c1")["runId"]
    page = browser()
    sign_in(page, server.http_url, viewer.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/{child}/")
    page.wait_for_selector('#events [data-sequence="1"]')
    for control in ("cancel", "cancel-subtree", "steer", "release-lease"):
        assert page.query_selector(f"[data-action={control}]") is None
    assert page.query_selector("#steer-message") is None
    # A forged POST with a valid CSRF token (from the sign-out form) is refused by the server.
    answer = page.evaluate(
        """async (url) => {
            const token = document.querySelector("input[name=csrfmiddlewaretoken]").value;
            const r = await fetch(url, {
                method: "POST",
                body: JSON.stringify({cascade: true}),
                headers: {"Content-Type": "application/json", "X-CSRFToken": token},
            });
            return {status: r.status, body: await r.json()};
        }""",
        f"/api/runs/{child}/cancel",
    )
    assert answer["status"] == 403
    assert (
        "user:vera has role viewer; cancel-subtree needs operator"
        in answer["body"]["error"]["message"]
    )
    page.goto(f"{server.http_url}/runs/{child}/")
    assert Run.objects.get(run_id=child).cancel_requested_at is None
    assert AuditEntry.objects.get(actor="user:vera").outcome.startswith("refused")


@pytest.mark.own_server
def test_it_shows_every_event_once_in_order_across_a_dropped_socket_and_a_restart(
    server, runner, browser, operator
):
    runner.open("root-1")
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/root-1/")
    page.wait_for_selector("#live-state[data-state=live]")
    page.evaluate(
        """() => { window.__states = [];
        new MutationObserver(() => window.__states.push(document.body.dataset.live))
          .observe(document.body, {attributes: true, attributeFilter: ["data-live"]}); }"""
    )
    for n in range(1, 11):
        runner.text("root-1", f"a{n}")
    page.wait_for_selector('#events [data-sequence="5"]')
    # Drop the page's socket mid-stream, as a network blip would, and keep emitting.
    page.evaluate("() => window.canopyLive.drop()")
    for n in range(11, 21):
        runner.text("root-1", f"b{n}")
    page.wait_for_selector('#events [data-sequence="20"]')
    # Restart the server: the page and the runner both lose their sockets.
    emitted = dict(runner.emitted)
    runner.close()
    server.restart(kill=True)
    token = tokens.create_runner("runner-b")[1]
    again = ScriptedRunner(f"ws://127.0.0.1:{server.port}/ws/runner/", token).start()
    again.emitted = emitted
    try:
        for n in range(21, 31):
            again.text("root-1", f"c{n}")
        page.wait_for_selector('#events [data-sequence="30"]', timeout=30000)
        page.wait_for_selector("#live-state[data-state=live]")
    finally:
        again.close()
    assert sequences(page) == list(range(1, 31))
    texts = page.eval_on_selector_all("#events .ev-text", "els => els.map(e => e.textContent)")
    assert texts == [f"a{n}" for n in range(1, 11)] + [f"b{n}" for n in range(11, 21)] + [
        f"c{n}" for n in range(21, 31)
    ]
    states = page.evaluate("() => window.__states")
    assert states.count("reconnecting") >= 2 and states[-1] == "live"
    assert page.evaluate("() => window.canopyLive.connects") >= 3


def test_it_runs_admin_actions_and_the_steer_form_with_audit_entries(
    server, runner, browser, operator
):
    runner.open("root-1")
    child = runner.child("root-1", "c1", lease_id="lease-1")["runId"]
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/admin/delegation/run/?q={child}")
    page.check(f'input[name=_selected_action][value="{Run.objects.get(run_id=child).pk}"]')
    page.select_option("select[name=action]", "steer_runs")
    page.click("button[name=index]")
    page.wait_for_selector("#steer-form")
    page.fill("#steer-form textarea[name=message]", "from the admin")
    page.click("#steer-form input[type=submit]")
    page.wait_for_selector(f"ul.messagelist li:has-text('{child}: injected')")
    assert Event.objects.get(kind="steer").actor == "user:olga"
    steer = AuditEntry.objects.get(action="steer")
    assert steer.via == "admin" and steer.detail["message"] == "from the admin"

    lease = Lease.objects.get(lease_id="lease-1")
    page.goto(f"{server.http_url}/admin/delegation/lease/")
    page.check(f'input[name=_selected_action][value="{lease.pk}"]')
    page.select_option("select[name=action]", "release_leases")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist li:has-text('lease-1: released')")
    lease.refresh_from_db()
    assert lease.state == "released"
    release = AuditEntry.objects.get(action="release", via="admin")
    assert release.actor == "user:olga"

    page.goto(f"{server.http_url}/admin/delegation/run/?q=root-1")
    page.check(f'input[name=_selected_action][value="{Run.objects.get(run_id="root-1").pk}"]')
    page.select_option("select[name=action]", "cancel_subtrees")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist li:has-text('root-1: requested')")
    assert AuditEntry.objects.get(action="cancel-subtree").via == "admin"
    # And the audit page shows all of it.
    page.goto(f"{server.http_url}/audit/?via=admin")
    assert page.locator("#audit-table tbody tr[data-audit-id]").count() == 3


def _big_tree(total_target: int = 10_000) -> tuple[str, int]:
    """A tree of about ten thousand runs written straight to the record (20 x 20 x 24)."""
    from delegation.models import Runner, Session

    runner_row = Runner.objects.get(name="runner-b")
    sessions = [
        Session(conversation_id=f"c-big-{i}", runner=runner_row, depth=0) for i in range(10_021)
    ]
    Session.objects.bulk_create(sessions, batch_size=2000)
    sessions = {
        s.conversation_id: s for s in Session.objects.filter(conversation_id__startswith="c-big-")
    }
    root = Run.objects.create(
        run_id="big-root", session=sessions["c-big-0"], runner=runner_row, depth=0
    )
    index = 1
    level = [root]
    for fanout in (20, 20, 24):
        rows = []
        for parent in level:
            for _ in range(fanout):
                rows.append(
                    Run(
                        run_id=f"big-{index}",
                        session=sessions[f"c-big-{index}"],
                        runner=runner_row,
                        parent=parent,
                        root=root,
                        depth=parent.depth + 1,
                        status="succeeded" if index % 3 else "running",
                        last_sequence=index % 50,
                    )
                )
                index += 1
        Run.objects.bulk_create(rows, batch_size=2000)
        level = list(Run.objects.filter(root=root, depth=level[0].depth + 1))
    return root.run_id, index


def test_it_keeps_a_tree_of_ten_thousand_runs_usable(server, runner, browser, operator):
    root_id, total = _big_tree()
    assert total >= 10_000
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/trees/{root_id}/")
    page.wait_for_selector('#tree [data-run-id="big-1"]', timeout=30000)
    # Painted from the first chunk; the count completes as the rest streams in.
    page.wait_for_selector(f"#tree-stats [data-role=total]:text-is('{total}')")
    # Virtualised: every level is expanded, but only the rows in view are in the DOM.
    rendered = page.locator("#tree .trow").count()
    assert 21 <= rendered <= 150, rendered
    assert page.get_attribute('#tree [data-run-id="big-1"]', "aria-expanded") == "true"
    page.click('#tree [data-run-id="big-1"] [data-toggle]')
    page.wait_for_selector('#tree [data-run-id="big-1"][aria-expanded="false"]')
    hidden_label = page.text_content('#tree [data-run-id="big-1"] .t-hidden')
    assert hidden_label.startswith("+500"), hidden_label
    page.click('#tree [data-run-id="big-1"] [data-toggle]')
    page.wait_for_selector('#tree [data-run-id="big-1"][aria-expanded="true"]')
    # Keyboard on a big tree: x collapses the selected run, j moves, and the page stays live.
    page.click('#tree [data-run-id="big-1"] .t-depth')
    page.keyboard.press("x")
    page.wait_for_selector('#tree [data-run-id="big-1"][aria-expanded="false"]')
    page.keyboard.press("j")
    assert page.get_attribute("#tree .trow.selected", "data-run-id") != "big-1"
    Run.objects.filter(run_id="big-2").update(status="failed")
    runner.open("after-big")  # any commit rings; the heartbeat diff also catches direct writes
    wait_status(page, "big-2", "failed", "#tree")

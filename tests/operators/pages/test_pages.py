"""Dashboard pages and actions through the Django test client, for each persona.

The records are made the way runners make them (tests.support.rpc's runner over the real runner socket)
so the pages read what the engine really writes.
"""

from __future__ import annotations

import json
import re

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from delegation.models import AuditEntry, Event, Lease, Run
from tests.support.personas import PASSWORD, signed_in

pytestmark = pytest.mark.django_db(transaction=True)


async def settle(runner, *methods):
    """Let the server finish sending (and recording answers to) the commands an action queued,
    so the database flush after the test does not race the runner socket's last writes."""
    for method in methods:
        await runner.wait_command(method)
    await runner.until_answered()


# Signed in before the test body, with CSRF checked as a browser's form posts are.
@pytest.fixture
def viewer_client(viewer) -> Client:
    return signed_in(viewer, csrf=True)


@pytest.fixture
def operator_client(operator) -> Client:
    return signed_in(operator, csrf=True)


@pytest.fixture
def outsider_client(outsider) -> Client:
    return signed_in(outsider, csrf=True)


def csrf(client: Client, path: str) -> str:
    page = client.get(path)
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert match, "the page has no CSRF-protected form"
    return match.group(1)


def api_post(client: Client, path: str, body: dict, token: str):
    return client.post(
        path, json.dumps(body), content_type="application/json", HTTP_X_CSRFTOKEN=token
    )


async def make_tree(runner):
    """root-1 with a child (leased) and a grandchild, some events, one refused spawn."""
    await runner.open("root-1")
    await runner.ok(
        "run.event",
        {
            "runId": "root-1",
            "from": 1,
            "events": [
                {"kind": "text", "text": "needle in the stream"},
                {"kind": "tool-use", "toolName": "grep", "input": {"q": "x"}},
            ],
        },
    )
    params = runner.child_params(request_id="c1")
    params["leaseId"] = "lease-1"
    params["request"]["leaseId"] = "lease-1"
    child = await runner.ok("child.start", params)
    grandchild = await runner.ok(
        "child.start", runner.child_params(run_id=child["runId"], request_id="g1")
    )
    await runner.open("root-2", profile="reviewer", extensionId="ext")
    return child["runId"], grandchild["runId"]


async def test_it_shows_trees_newest_first_with_counts_and_filters(runner, viewer_client):
    child, grandchild = await make_tree(runner)

    def check():
        viewer = viewer_client
        page = viewer.get("/trees/").content.decode()
        assert page.index('data-run-id="root-2"') < page.index('data-run-id="root-1"')
        row = page[page.index('data-run-id="root-1"') :].split("</tr>")[0]
        assert 'data-count="running"' in row and 'data-role="depth">2<' in row
        assert 'data-role="total">3<' in row
        # Filters: profile, runner, status, time, and search by id or by event text.
        only = viewer.get("/trees/?profile=reviewer").content.decode()
        assert 'data-run-id="root-2"' in only and 'data-run-id="root-1"' not in only
        found = viewer.get(f"/trees/?q={grandchild[:14]}").content.decode()
        assert 'data-run-id="root-1"' in found and 'data-run-id="root-2"' not in found
        text = viewer.get("/trees/?q=needle").content.decode()
        assert 'data-run-id="root-1"' in text and 'data-run-id="root-2"' not in text
        none = viewer.get("/trees/?status=failed").content.decode()
        assert "No tree matches" in none
        assert (
            'data-run-id="root-1"'
            in viewer.get("/trees/?since=1h&runner=runner-a").content.decode()
        )
        assert 'data-run-id="root-1"' not in viewer.get("/trees/?runner=other").content.decode()

    await database_sync_to_async(check)()


async def test_it_shows_a_run_with_its_result_fields_and_role_appropriate_controls(
    runner, viewer_client, operator_client
):
    child, grandchild = await make_tree(runner)

    def check():
        operator = operator_client
        page = operator.get(f"/runs/{child}/").content.decode()
        for field in (
            "runId",
            "conversationId",
            "runnerId",
            "hostInstanceId",
            "parentRunId",
            "parentConversationId",
            "extensionId",
            "profile",
            "depth",
            "status",
            "done",
            "cancelled",
        ):
            assert f'data-field="{field}"' in page, field
        assert 'data-action="cancel"' in page and 'data-action="cancel-subtree"' in page
        assert 'data-action="steer"' in page
        # The confirmation count: this run and its one live descendant.
        assert re.search(r'data-action="cancel-subtree" data-count="2"', page)
        assert 'data-lease-id="lease-1"' in page  # runs under the lease
        root_page = operator.get("/runs/root-1/").content.decode()
        assert 'data-action="release-lease"' in root_page

        viewer = viewer_client
        page = viewer.get(f"/runs/{child}/").content.decode()
        assert f'data-run-id="{child}"' in page
        for control in ("cancel", "cancel-subtree", "steer", "release-lease"):
            assert f'data-action="{control}"' not in page
        assert 'data-action="release-lease"' not in viewer.get("/runs/root-1/").content.decode()

    await database_sync_to_async(check)()


async def test_it_counts_only_unfinished_runs_below_a_run_on_its_page(runner, viewer_client):
    child, grandchild = await make_tree(runner)
    second = await runner.start(request_id="c2")
    finished = await runner.start(run_id=second["runId"], request_id="f1")
    await runner.finish(finished["runId"])

    def live_below(run_id: str) -> int:
        page = viewer_client.get(f"/runs/{run_id}/").content.decode()
        return int(re.search(r'data-role="live-descendants">(\d+)<', page).group(1))

    def check():
        # A root counts its whole tree; a branch only its own runs, finished ones left out.
        assert live_below("root-1") == 3  # child, grandchild, second
        assert live_below(child) == 1
        assert live_below(second["runId"]) == 0
        assert live_below(grandchild) == 0

    await database_sync_to_async(check)()


@pytest.mark.django_db
def test_it_refuses_outsiders_and_sends_strangers_to_sign_in(outsider_client):
    anonymous = Client()
    response = anonymous.get("/trees/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    outsider = outsider_client
    for path in ("/trees/", "/runners/", "/audit/"):
        response = outsider.get(path)
        assert response.status_code == 403
        assert "has no role" in response.content.decode()


@pytest.mark.django_db
def test_it_signs_in_and_out_with_csrf(operator):
    client = Client(enforce_csrf_checks=True)
    token = csrf(client, "/login/")
    # Without the token the form is refused.
    assert (
        client.post("/login/", {"username": operator.username, "password": PASSWORD}).status_code
        == 403
    )
    response = client.post(
        "/login/",
        {"username": operator.username, "password": PASSWORD, "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302 and response["Location"] == "/"
    # No tree is running, so home is the overview.
    assert client.get("/")["Location"] == "/trees/"
    assert client.get("/trees/").status_code == 200
    token = csrf(client, "/trees/")
    assert client.post("/logout/", {"csrfmiddlewaretoken": token}).status_code == 302
    assert client.get("/trees/").status_code == 302


async def test_it_cancels_a_subtree_through_the_service_and_audits_it(runner, operator_client):
    child, grandchild = await make_tree(runner)

    def act():
        operator = operator_client
        token = csrf(operator, f"/runs/{child}/")
        # No CSRF token: refused before anything happens.
        assert operator.post(f"/runs/{child}/cancel/", {"cascade": "1"}).status_code == 403
        response = operator.post(
            f"/runs/{child}/cancel/",
            {"cascade": "1", "reason": "runaway", "csrfmiddlewaretoken": token},
        )
        assert response.status_code == 302
        entry = AuditEntry.objects.get(action="cancel-subtree")
        assert entry.actor == "user:olga" and entry.via == "dashboard"
        assert entry.target_id == child and entry.reason == "runaway"
        assert entry.outcome == "requested"
        assert [d["runId"] for d in entry.detail["descendants"]] == [grandchild]
        for run_id in (child, grandchild):
            run = Run.objects.get(run_id=run_id)
            assert run.cancel_requested_at is not None
            assert Event.objects.filter(
                run=run, kind="cancel-requested", actor="user:olga"
            ).exists()
        page = operator.get(f"/runs/{child}/").content.decode()
        assert 'id="cancel-report"' in page and f'data-report-run="{grandchild}"' in page

    await database_sync_to_async(act)()
    await runner.wait_command("run.cancel", runId=grandchild)
    await settle(runner)


async def test_it_steers_and_releases_a_lease_through_the_services(runner, operator_client):
    child, grandchild = await make_tree(runner)

    def act():
        operator = operator_client
        token = csrf(operator, f"/runs/{child}/")
        # The run page's steer box posts here, with the session cookie and the page's token.
        response = api_post(
            operator,
            f"/api/runs/{child}/steer",
            {"message": "focus on tests", "requestId": "s-1"},
            token,
        )
        assert response.status_code == 200 and response.json()["outcome"] == "injected"
        steer = Event.objects.get(run__run_id=child, kind="steer")
        assert steer.actor == "user:olga" and steer.text == "focus on tests"
        assert AuditEntry.objects.filter(action="steer", outcome="injected").count() == 1
        # Blank message: refused by the service, with its message.
        response = api_post(
            operator, f"/api/runs/{child}/steer", {"message": "  ", "requestId": "s-2"}, token
        )
        assert response.status_code == 422
        assert "message: must not be blank" in response.json()["error"]["message"]
        lease = Lease.objects.get(lease_id="lease-1")
        response = operator.post(
            f"/leases/{lease.pk}/release/", {"csrfmiddlewaretoken": token}, follow=True
        )
        assert response.status_code == 200
        lease.refresh_from_db()
        assert lease.state == "released"
        assert AuditEntry.objects.filter(action="release", target_id="lease-1").exists()

    await database_sync_to_async(act)()
    await settle(runner, "run.steer", "lease.revoked", "run.cancel")


async def test_it_refuses_a_viewers_forged_actions_with_a_clear_message(runner, viewer_client):
    child, grandchild = await make_tree(runner)

    def act():
        viewer = viewer_client
        token = csrf(viewer, "/trees/")  # the sign-out form gives a valid token
        lease = Lease.objects.get(lease_id="lease-1")
        attempts = [
            (f"/runs/{child}/cancel/", {"cascade": "1"}),
            (f"/leases/{lease.pk}/release/", {}),
        ]
        for path, data in attempts:
            response = viewer.post(path, {**data, "csrfmiddlewaretoken": token})
            assert response.status_code == 403, path
            body = response.content.decode()
            assert "Refused: user:vera has role viewer" in body and "needs operator" in body
        # The JSON surface is the REST API, with the same session and token.
        for path, data in (
            (f"/api/runs/{child}/steer", {"message": "hi", "requestId": "x"}),
            (f"/api/runs/{child}/cancel", {}),
        ):
            response = api_post(viewer, path, data, token)
            assert response.status_code == 403, path
            error = response.json()["error"]
            assert error["code"] == "forbidden", path
            assert "user:vera has role viewer" in error["message"], path
            assert "needs operator" in error["message"], path
        assert not Run.objects.filter(cancel_requested_at__isnull=False).exists()
        assert not Event.objects.filter(kind="steer").exists()
        assert Lease.objects.get(lease_id="lease-1").state == "active"
        refused = AuditEntry.objects.filter(outcome__startswith="refused")
        assert refused.count() == 4 and {e.actor for e in refused} == {"user:vera"}

    await database_sync_to_async(act)()


async def test_it_lists_runners_and_filters_the_audit_log(runner, viewer_client, operator_client):
    await make_tree(runner)

    def check():
        operator = operator_client
        page = operator.get("/runners/").content.decode()
        assert 'data-runner-id="runner-a"' in page and 'data-connected="1"' in page
        assert "host-1" in page and "ext/worker" in page
        token = csrf(operator, "/runs/root-1/")
        operator.post("/runs/root-1/cancel/", {"reason": "stop", "csrfmiddlewaretoken": token})
        viewer = viewer_client
        viewer.post("/runs/root-2/cancel/", {"csrfmiddlewaretoken": csrf(viewer, "/trees/")})
        audit = operator.get("/audit/?actor=olga").content.decode()
        assert 'data-action="cancel"' in audit and "user:vera" not in audit
        refused = operator.get("/audit/?outcome=refused").content.decode()
        assert "user:vera" in refused and "user:olga" not in refused
        by_target = operator.get("/audit/?target=root-2&via=dashboard").content.decode()
        assert "root-2" in by_target and 'data-outcome="requested"' not in by_target

    await database_sync_to_async(check)()
    await settle(runner, "run.cancel")


async def test_it_serves_a_tree_page_and_redirects_a_child_to_its_root(runner, viewer_client):
    child, grandchild = await make_tree(runner)

    def check():
        viewer = viewer_client
        # Home opens on the newest running tree.
        assert viewer.get("/")["Location"] == "/trees/root-2/"
        page = viewer.get("/trees/root-1/").content.decode()
        assert 'data-tree-id="root-1"' in page and "tree-page.js" in page
        assert "http://" not in page.replace("http://www.w3.org", "")  # nothing from a CDN
        response = viewer.get(f"/trees/{grandchild}/")
        assert response.status_code == 302
        assert response["Location"] == f"/trees/root-1/?focus={grandchild}"
        assert viewer.get("/runs/nope/").status_code == 404

    await database_sync_to_async(check)()

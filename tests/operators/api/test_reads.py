"""Reads: filters, keyset pagination, run detail, subtree, events, strict query strings."""

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from delegation.models import AuditEntry, Run
from delegation.runner_socket import methods
from delegation.services.run_actions import Actor, audit
from tests.support.api import drive_runner, emit, start_child

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(as_):
    return as_("viewer", "token")


def run_ids(response) -> set[str]:
    assert response.status_code == 200, response.content
    return {item["runId"] for item in response.json()["items"]}


def test_it_filters_runs(api, world):
    child, grand = world.child["runId"], world.grandchild["runId"]
    leased, done = world.leased["runId"], world.finished["runId"]
    everything = {"root-1", child, grand, leased, done}
    assert run_ids(api.get("/api/runs")) == everything
    assert run_ids(api.get("/api/runs", {"status": "succeeded"})) == {done}
    assert run_ids(api.get("/api/runs?status=succeeded&status=running")) == everything
    assert run_ids(api.get("/api/runs", {"depth": 2})) == {grand}
    assert run_ids(api.get("/api/runs", {"depth_min": 1, "depth_max": 1})) == {child, leased, done}
    assert run_ids(api.get("/api/runs", {"depth_max": 0})) == {"root-1"}
    assert run_ids(api.get("/api/runs", {"profile": "reviewer"})) == {done}
    assert run_ids(api.get("/api/runs", {"runner": "runner-a"})) == everything
    assert run_ids(api.get("/api/runs", {"runner": "runner-b"})) == set()
    assert run_ids(api.get("/api/runs", {"root": "root-1"})) == everything
    assert run_ids(api.get("/api/runs", {"parent": "root-1"})) == {child, leased, done}
    assert run_ids(api.get("/api/runs", {"parent": child})) == {grand}
    assert run_ids(api.get("/api/runs", {"conversation": "conv-root-1"})) == {"root-1"}
    assert run_ids(api.get("/api/runs", {"q": "NEEDLE"})) == {"root-1"}
    assert run_ids(api.get("/api/runs", {"q": "child says"})) == {child}
    assert run_ids(api.get("/api/runs", {"q": "nowhere"})) == set()
    assert run_ids(api.get("/api/runs", {"status": "running", "depth": 1})) == {child, leased}


def test_it_filters_runs_by_creation_time(api, world):
    past = timezone.now() - timedelta(days=3)
    Run.objects.filter(run_id="root-1").update(created_at=past)
    cut = (past + timedelta(days=1)).isoformat()
    before = run_ids(api.get("/api/runs", {"created_before": cut}))
    after = run_ids(api.get("/api/runs", {"created_after": cut}))
    assert before == {"root-1"}
    assert "root-1" not in after and len(after) == 4
    # "Z" and lowercase forms of RFC 3339 are accepted; no offset is refused.
    zulu = (past + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert run_ids(api.get("/api/runs", {"created_before": zulu})) == {"root-1"}
    refused = api.get("/api/runs", {"created_before": "2025-01-01T00:00:00"})
    assert refused.status_code == 422
    assert "created_before" in refused.json()["error"]["message"]


def test_it_pages_runs_by_cursor_and_stays_stable_under_inserts(api, world):
    conn = world.conn
    for index in range(7):
        methods.open_run(conn, {"conversationId": f"c-more-{index}", "runId": f"more-{index}"})
    expected = set(Run.objects.values_list("run_id", flat=True))
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        body = api.get("/api/runs", params).json()
        seen += [item["runId"] for item in body["items"]]
        pages += 1
        if pages == 2:
            # Runs opened mid-walk are newer than page one: they never land in a later page.
            methods.open_run(conn, {"conversationId": "c-late", "runId": "late"})
        cursor = body["next"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == len(expected)
    assert set(seen) == expected
    assert pages == 4
    newest_first = list(Run.objects.exclude(run_id="late").order_by("-pk"))
    assert seen == [run.run_id for run in newest_first]


def test_it_refuses_bad_query_strings_naming_the_parameter(api, world):
    cases = {
        "/api/runs?stauts=running": "stauts",
        "/api/runs?depth=1&depth=2": "depth",
        "/api/runs?depth=-1": "depth",
        "/api/runs?depth=1.0": "depth",
        "/api/runs?depth=%201": "depth",
        "/api/runs?limit=0": "limit",
        "/api/runs?limit=1001": "limit",
        "/api/runs?status=sleeping": "status",
        "/api/runs?cursor=nope": "cursor",
        "/api/runs?cursor=s1f": "cursor",  # a sessions cursor is not a runs cursor
        "/api/runs?created_after=yesterday": "created_after",
        "/api/leases?live=yes": "live",
        "/api/runs/root-1?verbose=true": "verbose",
        "/api/runs/root-1/events?limit=1001": "limit",
    }
    for path, name in cases.items():
        response = api.get(path)
        assert response.status_code == 422, path
        error = response.json()["error"]
        assert error["code"] == "invalid" and name in error["message"], (path, error)


def test_it_answers_an_empty_page_for_a_nul_filter(api, world):
    # PostgreSQL cannot even compare text with NUL; no stored id holds one, so nothing matches.
    assert run_ids(api.get("/api/runs", {"runner": "a\x00b"})) == set()
    assert api.get("/api/runs/a%00b").status_code == 404


def test_it_shows_a_run_with_its_result_child_counts_and_lease(api, world):
    body = api.get("/api/runs/root-1").json()
    result_fields = {
        "runnerId", "hostInstanceId", "conversationId", "runId", "parentConversationId",
        "parentRunId", "extensionId", "profile", "done", "cancelled", "error", "output",
        "events", "depth", "status",
    }  # fmt: skip
    assert result_fields <= set(body)
    assert body["runId"] == "root-1" and body["depth"] == 0 and body["status"] == "running"
    assert body["parentRunId"] == "" and body["events"] == [] and body["lease"] is None
    assert body["childCounts"] == {
        "running": 2, "succeeded": 1, "failed": 0, "cancelled": 0, "lost": 0, "total": 3,
    }  # fmt: skip
    assert body["lastSequence"] == 4 and body["rootRunId"] == "root-1"
    assert body["task"] == ""  # run.open sent no message

    leased = api.get(f"/api/runs/{world.leased['runId']}").json()
    assert leased["lease"]["leaseId"] == "lease-1"
    assert leased["lease"]["id"] == world.lease_pk and leased["lease"]["live"] is True
    assert leased["parentRunId"] == "root-1" and leased["depth"] == 1
    # The task names the run for a REST user as the dashboard does (issue 38), in the
    # detail as in the list.
    assert leased["task"] == "do the thing"
    listed = api.get("/api/runs", {"parent": "root-1"}).json()["items"]
    assert {item["task"] for item in listed} == {"do the thing"}

    done = api.get(f"/api/runs/{world.finished['runId']}").json()
    assert done["output"] == "all done" and done["done"] is True
    assert done["status"] == "succeeded" and done["finishedAt"] is not None

    missing = api.get("/api/runs/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_it_nests_a_subtree_with_a_depth_limit(api, world):
    child, grand = world.child["runId"], world.grandchild["runId"]
    tree = json.loads(api.get("/api/runs/root-1/tree").getvalue())
    assert tree["runId"] == "root-1"
    kids = {node["runId"]: node for node in tree["children"]}
    assert set(kids) == {child, world.leased["runId"], world.finished["runId"]}
    assert [n["runId"] for n in kids[child]["children"]] == [grand]
    assert kids[child]["childrenIncluded"] is True

    shallow = json.loads(api.get("/api/runs/root-1/tree", {"levels": 1}).getvalue())
    shallow_kids = {node["runId"]: node for node in shallow["children"]}
    # The boundary node keeps its counts but not its children.
    assert shallow_kids[child]["children"] == []
    assert shallow_kids[child]["childrenIncluded"] is False
    assert shallow_kids[child]["childCounts"]["total"] == 1

    alone = json.loads(api.get("/api/runs/root-1/tree", {"levels": 0}).getvalue())
    assert alone["children"] == [] and alone["childCounts"]["total"] == 3

    branch = json.loads(api.get(f"/api/runs/{child}/tree").getvalue())
    assert branch["runId"] == child and branch["parentRunId"] == "root-1"
    assert [n["runId"] for n in branch["children"]] == [grand]


def test_it_reads_events_after_a_sequence_with_a_limit_and_kinds(api, world):
    body = api.get("/api/runs/root-1/events").json()
    assert [e["sequence"] for e in body["items"]] == [1, 2, 3, 4]
    assert body["next"] is None and body["lastSequence"] == 4
    assert body["items"][0] == {"sequence": 1, "kind": "text", "text": "hello world"}
    assert body["items"][2] == {
        "sequence": 3, "kind": "tool-result", "toolCallId": "t1", "toolOutput": ["a", "b"],
        "success": True,
    }  # fmt: skip
    after = api.get("/api/runs/root-1/events", {"after": 2}).json()
    assert [e["sequence"] for e in after["items"]] == [3, 4]
    kinds = api.get("/api/runs/root-1/events?kind=tool-use&kind=tool-result").json()
    assert [e["kind"] for e in kinds["items"]] == ["tool-use", "tool-result"]

    first = api.get("/api/runs/root-1/events", {"limit": 3}).json()
    assert [e["sequence"] for e in first["items"]] == [1, 2, 3]
    second = api.get("/api/runs/root-1/events", {"limit": 3, "cursor": first["next"]}).json()
    assert [e["sequence"] for e in second["items"]] == [4]
    assert second["next"] is None


def test_it_reads_a_thousand_events_per_page_at_most(api, world):
    emit(world.conn, world.child["runId"], [f"e{i}" for i in range(1200)], start=3)
    path = f"/api/runs/{world.child['runId']}/events"
    page = api.get(path, {"limit": 1000}).json()
    assert len(page["items"]) == 1000 and page["next"] is not None
    rest = api.get(path, {"limit": 1000, "cursor": page["next"]}).json()
    assert len(rest["items"]) == 202 and rest["next"] is None
    assert rest["items"][-1]["sequence"] == 1202


def test_it_lists_sessions_leases_runners_and_audit(api, as_, world):
    sessions = api.get("/api/sessions").json()["items"]
    assert len(sessions) == 5
    top = api.get("/api/sessions", {"depth": 0}).json()["items"]
    assert [s["conversationId"] for s in top] == ["conv-root-1"]
    under = api.get("/api/sessions", {"parent": "conv-root-1"}).json()["items"]
    assert len(under) == 3
    detail = api.get("/api/sessions/conv-root-1").json()
    assert [r["runId"] for r in detail["runs"]] == ["root-1"]
    assert api.get("/api/sessions/none").status_code == 404

    leases = api.get("/api/leases", {"runner": "runner-a", "lease_id": "lease-1"}).json()
    (lease,) = leases["items"]
    assert lease["id"] == world.lease_pk and lease["state"] == "active" and lease["live"]
    assert lease["parentRunId"] == "root-1" and lease["childCount"] == 1
    assert api.get(f"/api/leases/{world.lease_pk}").json()["leaseId"] == "lease-1"
    assert api.get("/api/leases", {"live": "false"}).json()["items"] == []
    assert api.get("/api/leases/999999").status_code == 404

    runners = api.get("/api/runners").json()["items"]
    assert [(r["runnerId"], r["state"]) for r in runners] == [("runner-a", "connected")]
    runner = api.get("/api/runners/runner-a").json()
    assert {p["name"] for p in runner["presets"]} == {"worker", "reviewer"}
    assert runner["runCounts"]["total"] == 5
    assert api.get("/api/runners/ghost").status_code == 404

    operator = as_("operator", "token")
    operator.post(f"/api/runs/{world.child['runId']}/cancel", {"reason": "enough"})
    operator.post(f"/api/runs/{world.leased['runId']}/steer", {"requestId": "r1", "message": "hi"})
    entries = api.get("/api/audit").json()["items"]
    assert [e["action"] for e in entries] == ["steer", "cancel"]
    cancel = api.get("/api/audit", {"action": "cancel", "user": "olga"}).json()["items"]
    assert cancel[0]["reason"] == "enough" and cancel[0]["via"] == "api"
    assert cancel[0]["targetId"] == world.child["runId"] and cancel[0]["actor"] == "user:olga"
    by_target = api.get("/api/audit", {"target_id": world.leased["runId"]}).json()["items"]
    assert [e["action"] for e in by_target] == ["steer"]
    assert api.get("/api/audit", {"via": "runner"}).json()["items"] == []


def test_it_answers_json_for_unknown_paths_and_methods(api, world):
    missing = api.get("/api/nothing/here")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = api.client.delete("/api/runs/root-1", headers=api.headers)
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed" and wrong["Allow"] == "GET"


def test_it_searches_runs_and_filters_audit_with_the_dashboards_meaning(api, world, viewer):
    """One set of selectors behind /api/runs?q=, /trees/?q=, /api/audit and /audit/."""
    done = world.finished["runId"]
    dashboard = Client()
    dashboard.force_login(viewer)
    # Text search covers the run's output and runId too, not only its events' text.
    assert run_ids(api.get("/api/runs", {"q": "ALL DONE"})) == {done}
    assert run_ids(api.get("/api/runs", {"q": done.upper()})) == {done}
    trees = dashboard.get("/trees/", {"q": "all done"}).content.decode()
    assert 'data-tree-id="root-1"' in trees
    assert (
        'data-tree-id="root-1"' not in dashboard.get("/trees/", {"q": "nowhere"}).content.decode()
    )

    for target, outcome in (("root-2", "refused: needs operator"), ("root-20", "requested")):
        AuditEntry.objects.create(
            actor="user:olga",
            via="dashboard",
            action="cancel",
            target_type="run",
            target_id=target,
            outcome=outcome,
        )
    # actor and outcome: case-insensitive substrings; target: exact (root-2 is not root-20).
    by_actor = api.get("/api/audit", {"actor": "OLGA"}).json()["items"]
    assert {e["targetId"] for e in by_actor} == {"root-2", "root-20"}
    refused = api.get("/api/audit", {"outcome": "refused"}).json()["items"]
    assert [e["targetId"] for e in refused] == ["root-2"]
    by_target = api.get("/api/audit", {"target_id": "root-2"}).json()["items"]
    assert [e["targetId"] for e in by_target] == ["root-2"]
    page = dashboard.get("/audit/", {"target": "root-2", "actor": "OLGA"}).content.decode()
    assert ">root-2</a>" in page and ">root-20</a>" not in page
    page = dashboard.get("/audit/", {"outcome": "refused"}).content.decode()
    assert 'data-outcome="refused: needs operator"' in page
    assert 'data-outcome="requested"' not in page


def _add_session(world, tag):
    methods.open_run(world.conn, {"conversationId": f"c-{tag}", "runId": f"run-{tag}"})


def _add_lease(world, tag):
    # A parent of its own: one parent may have only so many running children.
    methods.open_run(world.conn, {"conversationId": f"c-{tag}", "runId": f"parent-{tag}"})
    start_child(world.conn, f"parent-{tag}", f"req-{tag}", lease=f"lease-{tag}")


def _add_audit(world, tag):
    audit(Actor(label="user:olga", via="api"), "cancel", "run", f"target-{tag}", "requested")


def _add_runner(world, tag):
    drive_runner(f"runner-{tag}")


# Every list besides runs and events: how to add one item, which field names it, and whether
# the list runs newest first (an item added mid-walk then never lands on a later page) or
# oldest first (it lands at the end).
LISTS = {
    "/api/sessions": (_add_session, "conversationId", True),
    "/api/leases": (_add_lease, "leaseId", True),
    "/api/audit": (_add_audit, "targetId", True),
    "/api/runners": (_add_runner, "runnerId", False),
}


@pytest.mark.parametrize("path", list(LISTS))
def test_it_follows_the_cursor_past_page_one_while_items_are_added(api, world, path):
    add, key, newest_first = LISTS[path]
    for index in range(7):
        add(world, f"before-{index}")
    expected = [item[key] for item in api.get(path, {"limit": 1000}).json()["items"]]
    assert len(expected) >= 7
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 3} if cursor is None else {"limit": 3, "cursor": cursor}
        response = api.get(path, params)
        assert response.status_code == 200, response.content
        body = response.json()
        assert len(body["items"]) <= 3
        seen += [item[key] for item in body["items"]]
        pages += 1
        if pages == 1:
            for index in range(2):
                add(world, f"during-{index}")
        cursor = body["next"]
        if cursor is None:
            break
        assert pages < 20, seen
    assert len(seen) == len(set(seen)), seen
    if newest_first:
        assert seen == expected
    else:
        added = [item[key] for item in api.get(path, {"limit": 1000}).json()["items"]]
        assert seen == expected + added[len(expected) :] and len(added) == len(expected) + 2

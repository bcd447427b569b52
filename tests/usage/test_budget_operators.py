"""SPEC §10 for operators: rollups and budgets on REST (detail, tree, lists sorted by subtree
cost with a keyset cursor, export), budgets set through REST, the run page form and the
admin action — role-checked and audited — and a limit lowered below use stopping at once."""

import json

import pytest

from delegation.models import AuditEntry, Budget, Event, Run
from delegation.runner_socket import methods
from tests.support.api import emit
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db


def usage(tokens_in, tokens_out, cost):
    return {
        "kind": "usage",
        "input": {"inputTokens": tokens_in, "outputTokens": tokens_out, "costUsd": cost},
    }


def send(api, method: str, path: str, body) -> object:
    return api.client.generic(
        method, path, json.dumps(body), content_type="application/json", headers=api.headers
    )


def test_it_shows_rollups_on_detail_tree_and_lists(as_, world):
    emit(world.conn, world.grandchild["runId"], [usage(100, 20, 0.5)])
    emit(world.conn, world.child["runId"], [usage(10, 2, 0.25)], start=3)
    emit(world.conn, "root-1", [usage(1, 1, 0.125)], start=5)
    api = as_("viewer", "token")
    detail = api.get("/api/runs/root-1").json()
    subtree = detail["usage"]["subtree"]
    assert (subtree["inputTokens"], subtree["outputTokens"], subtree["costUsd"]) == (111, 23, 0.875)
    assert subtree["runs"]["total"] == 5 and subtree["live"] == 4
    assert detail["usage"]["own"]["costUsd"] == 0.125 and detail["budget"] is None
    # The subtree is streamed: read it whole.
    assert "usage" not in json.loads(api.get("/api/runs/root-1/tree").getvalue())
    tree = json.loads(api.get("/api/runs/root-1/tree", {"usage": "true"}).getvalue())
    child = next(c for c in tree["children"] if c["runId"] == world.child["runId"])
    assert child["usage"]["own"]["inputTokens"] == 10
    assert child["usage"]["subtree"]["inputTokens"] == 110
    listed = api.get("/api/runs", {"order": "-subtreeCost", "limit": 2}).json()
    assert [item["runId"] for item in listed["items"]] == ["root-1", world.child["runId"]]
    assert listed["items"][0]["usage"]["subtree"]["costUsd"] == 0.875


def test_it_pages_runs_by_subtree_cost_with_a_stable_cursor(as_, world):
    # Every run gets its own cost; ties on zero cost fall back to newest first.
    emit(world.conn, world.leased["runId"], [usage(1, 1, 0.3)])
    emit(world.conn, world.grandchild["runId"], [usage(1, 1, 0.1)])
    api = as_("viewer", "token")
    seen, cursor = [], None
    while True:
        params = {"order": "-subtreeCost", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/api/runs", params).json()
        seen += [(i["runId"], i["usage"]["subtree"]["costUsd"]) for i in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert len(seen) == Run.objects.count() == len({run_id for run_id, _ in seen})
    costs = [cost for _, cost in seen]
    assert costs == sorted(costs, reverse=True)
    assert seen[0] == ("root-1", pytest.approx(0.4))


def test_it_sets_a_budget_through_rest_audited_and_role_checked(as_, world):
    operator = as_("operator", "token")
    response = send(
        operator,
        "PUT",
        "/api/runs/root-1/budget",
        {"maxRuns": 10, "maxCostUsd": 2.5, "reason": "demo"},
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["limits"]["maxRuns"] == {"limit": 10, "used": 4, "fraction": 0.4}
    # Integers stay integers on the wire ("limit": 10, never 10.0).
    assert '"limit": 10,' in response.content.decode() and ".0," not in response.content.decode()
    assert body["limits"]["maxCostUsd"]["limit"] == 2.5 and body["setBy"] == "user:olga"
    entry = AuditEntry.objects.get(action="budget")
    assert (entry.via, entry.target_id, entry.reason) == ("api", "root-1", "demo")
    assert entry.detail == {"before": {}, "after": {"maxRuns": 10, "maxCostUsd": 2.5}}
    # PATCH changes one limit and keeps the others; PUT replaces them all.
    response = send(operator, "PATCH", "/api/runs/root-1/budget", {"maxLive": 3})
    assert set(response.json()["limits"]) == {"maxRuns", "maxCostUsd", "maxLive"}
    response = send(operator, "PUT", "/api/runs/root-1/budget", {"maxTokens": 1000})
    assert set(response.json()["limits"]) == {"maxTokens"}
    detail = operator.get("/api/runs/root-1")
    assert detail.json()["budget"]["limits"]["maxTokens"]["limit"] == 1000
    assert '"limit": 1000,' in detail.content.decode()
    # A viewer may not; the refusal is audited and nothing changes.
    viewer = as_("viewer", "token")
    response = send(viewer, "PUT", "/api/runs/root-1/budget", {"maxTokens": 10**9})
    assert response.status_code == 403
    assert AuditEntry.objects.filter(action="budget", outcome__startswith="refused").count() == 1
    assert Budget.objects.get(run__run_id="root-1").max_tokens == 1000
    # Bad bodies name the field.
    for body, field in (
        ({"maxRuns": -1}, "maxRuns"),
        ({"maxDollars": 1}, "maxDollars"),
        ({"maxCostUsd": "1"}, "maxCostUsd"),
    ):
        response = send(operator, "PUT", "/api/runs/root-1/budget", body)
        assert response.status_code == 422 and field in response.json()["error"]["message"]


def test_it_stops_the_subtree_at_once_when_a_limit_is_set_below_use(as_, world):
    emit(world.conn, world.child["runId"], [usage(500, 500, 0.1)], start=3)
    response = send(
        as_("operator", "token"),
        "PUT",
        f"/api/runs/{world.child['runId']}/budget",
        {"maxTokens": 600},
    )
    assert response.status_code == 200
    assert response.json()["exceededReason"].startswith("budget exceeded: maxTokens 600")
    stopped = set(
        Run.objects.filter(cancel_requested_at__isnull=False).values_list("run_id", flat=True)
    )
    assert stopped == {world.child["runId"], world.grandchild["runId"]}
    event = Event.objects.get(kind="budget-exceeded")
    assert event.run.run_id == world.child["runId"] and event.actor == "budget"
    # Refusals name the budget's run from now on.
    params = {"runId": world.grandchild["runId"], "extensionId": "ext", "generation": 1,
              "request": {"requestId": "late", "profile": "worker", "message": "go"}}  # fmt: skip
    with pytest.raises(Exception) as refused:
        methods.child_start(world.conn, params)
    assert refused.value.code == -32017 and world.child["runId"] in refused.value.message


def test_it_exports_usage_lines_after_the_events(as_, world):
    emit(world.conn, world.child["runId"], [usage(7, 3, 0.01)], start=3)
    api = as_("viewer", "token")
    plain = b"".join(api.get("/api/runs/root-1/export", {"subtree": "true"}).streaming_content)
    assert b'"record"' not in plain
    body = b"".join(
        api.get("/api/runs/root-1/export", {"subtree": "true", "usage": "true"}).streaming_content
    )
    lines = [json.loads(line) for line in body.splitlines()]
    records = {line["runId"]: line for line in lines if line.get("record") == "usage"}
    assert len(records) == Run.objects.count()
    assert records["root-1"]["usage"]["subtree"]["inputTokens"] == 7
    assert records[world.child["runId"]]["usage"]["own"]["outputTokens"] == 3
    assert lines[-1].get("record") == "usage" and "sequence" in lines[0]


def test_it_sets_a_budget_from_the_run_page_and_shows_the_bar(world, people):
    page = signed_in(people["operator"])
    response = page.post(
        "/runs/root-1/budget/", {"maxRuns": "8", "maxCostUsd": "", "reason": "page"}
    )
    assert response.status_code == 302
    budget = Budget.objects.get(run__run_id="root-1")
    assert (budget.max_runs, budget.max_cost_nanos) == (8, None)
    entry = AuditEntry.objects.get(action="budget")
    assert (entry.via, entry.reason) == ("dashboard", "page")
    html = page.get("/runs/root-1/").content.decode()
    assert 'data-limit="maxRuns"' in html and 'data-percent="50"' in html  # 4 of 8
    assert 'id="budget-form"' in html
    # A viewer sees the bar but no form, and cannot post one.
    viewer = signed_in(people["viewer"])
    html = viewer.get("/runs/root-1/").content.decode()
    assert 'data-limit="maxRuns"' in html and 'id="budget-form"' not in html
    assert viewer.post("/runs/root-1/budget/", {"maxRuns": "100"}).status_code == 403
    assert Budget.objects.get(run__run_id="root-1").max_runs == 8
    assert page.post("/runs/root-1/budget/", {"maxRuns": "many"}).status_code == 400


def test_it_sets_budgets_from_the_admin_action(world, people):
    client = signed_in(people["operator"])
    pk = Run.objects.get(run_id="root-1").pk
    response = client.post(
        "/admin/delegation/run/",
        {"action": "set_budgets", "_selected_action": [pk], "apply": "1", "maxTokens": "5000"},
        follow=True,
    )
    assert response.status_code == 200
    assert Budget.objects.get(run__run_id="root-1").max_tokens == 5000
    entry = AuditEntry.objects.get(action="budget")
    assert (entry.via, entry.actor) == ("admin", "user:olga")
    assert client.get("/admin/delegation/budget/").status_code == 200


def test_it_shows_and_sets_on_limit_through_rest_the_run_page_and_the_admin(as_, world, people):
    """SPEC §14: a budget's onLimit appears in REST's budget output and is set by all three."""
    operator = as_("operator", "token")
    body = send(operator, "PUT", "/api/runs/root-1/budget", {"maxRuns": 10}).json()
    assert body["onLimit"] == "cancel"
    body = send(operator, "PATCH", "/api/runs/root-1/budget", {"onLimit": "pause"}).json()
    assert body["onLimit"] == "pause" and set(body["limits"]) == {"maxRuns"}
    assert operator.get("/api/runs/root-1").json()["budget"]["onLimit"] == "pause"
    bad = send(operator, "PATCH", "/api/runs/root-1/budget", {"onLimit": "wait"})
    assert bad.status_code == 422 and "onLimit" in bad.json()["error"]["message"]

    page = signed_in(people["operator"])
    html = page.get("/runs/root-1/").content.decode()
    assert '<option value="pause" selected>' in html and "pauses and one item asks" in html
    page.post("/runs/root-1/budget/", {"maxRuns": "9", "onLimit": "cancel"})
    assert Budget.objects.get(run__run_id="root-1").on_limit == "cancel"
    answer = page.post("/runs/root-1/budget/", {"maxRuns": "9", "onLimit": "later"})
    assert answer.status_code == 422 and "onLimit" in answer.content.decode()
    assert '<option value="later"' not in answer.content.decode()

    pk = Run.objects.get(run_id="root-1").pk
    page.post(
        "/admin/delegation/run/",
        {
            "action": "set_budgets",
            "_selected_action": [pk],
            "apply": "1",
            "maxRuns": "7",
            "onLimit": "pause",
        },
        follow=True,
    )
    budget = Budget.objects.get(run__run_id="root-1")
    assert (budget.max_runs, budget.on_limit) == (7, "pause")

"""``GET /api/runs/{runId}/children?status=`` (issue 24) and conclusions in the REST reads."""

import pytest

from delegation.runner_socket import methods

pytestmark = pytest.mark.django_db

BLOCK = (
    '```canopy-conclusion\n{"status": "partial", "summary": "Half of it.", "followUp": ["b"]}\n```'
)


@pytest.fixture
def api(as_):
    return as_("viewer", "token")


def test_it_lists_a_runs_children_with_output_and_conclusion(api, world):
    methods.finish_run(world.conn, {"runId": world.child["runId"], "output": f"did a\n{BLOCK}"})
    answer = api.get("/api/runs/root-1/children")
    assert answer.status_code == 200, answer.content
    items = {item["runId"]: item for item in answer.json()["items"]}
    # The direct children only (not the grandchild), each with its output and conclusion.
    assert set(items) == {
        world.child["runId"],
        world.leased["runId"],
        world.finished["runId"],
    }
    concluded = items[world.child["runId"]]
    assert concluded["conclusion"]["status"] == "partial"
    assert concluded["conclusion"]["followUp"] == ["b"]
    assert concluded["conclusionStatus"] == "partial"
    assert concluded["output"].startswith("did a")
    assert items[world.finished["runId"]]["output"] == "all done"
    assert items[world.finished["runId"]]["conclusion"] is None

    succeeded = api.get("/api/runs/root-1/children", {"status": "succeeded"}).json()["items"]
    assert {i["runId"] for i in succeeded} == {world.child["runId"], world.finished["runId"]}
    running = api.get("/api/runs/root-1/children", {"status": "running"}).json()["items"]
    assert [i["runId"] for i in running] == [world.leased["runId"]]
    page = api.get("/api/runs/root-1/children", {"limit": 2}).json()
    rest = api.get("/api/runs/root-1/children", {"limit": 2, "cursor": page["next"]}).json()
    assert len(page["items"]) == 2 and len(rest["items"]) == 1 and rest["next"] is None


def test_it_answers_404_or_422_for_an_unknown_run_or_a_bad_filter(api, world):
    assert api.get("/api/runs/nope/children").status_code == 404
    assert api.get("/api/runs/root-1/children", {"status": "finished"}).status_code == 422
    assert api.get("/api/runs/root-1/children", {"parent": "x"}).status_code == 422


def test_it_shows_the_conclusion_on_the_run_detail_and_the_run_lists(api, world):
    assert api.get("/api/runs/root-1").json()["conclusion"] is None
    methods.finish_run(world.conn, {"runId": "root-1", "output": BLOCK})
    detail = api.get("/api/runs/root-1").json()
    assert detail["conclusion"]["summary"] == "Half of it."
    listed = {i["runId"]: i for i in api.get("/api/runs").json()["items"]}
    assert listed["root-1"]["conclusionStatus"] == "partial"
    assert listed[world.child["runId"]]["conclusionStatus"] is None


def test_it_refuses_the_children_list_to_a_user_without_a_role(as_, world):
    assert as_("outsider", "token").get("/api/runs/root-1/children").status_code == 403
    assert as_("anonymous", None).get("/api/runs/root-1/children").status_code == 401


def test_it_marks_tree_rows_with_the_conclusion_status(api, world):
    from delegation import selectors
    from delegation.models import Run

    methods.finish_run(world.conn, {"runId": world.child["runId"], "output": BLOCK})
    root = Run.objects.get(run_id="root-1")
    rows = {row["runId"]: row for row in selectors.tree_rows(root)}
    assert rows[world.child["runId"]]["conclusionStatus"] == "partial"
    assert rows["root-1"]["conclusionStatus"] is None
    columns, _last, _keep = selectors.tree_chunk(root.pk)
    marks = dict(zip(columns["runId"], columns["conclusionStatus"], strict=True))
    assert marks[world.child["runId"]] == "partial" and marks["root-1"] is None

"""Pause and resume over REST (SPEC §14): one service, status ``paused`` on the run and its
subtree, ``run.pause``/``run.resume`` commands for the runner, audited; paused time does not
count toward ``maxSeconds``."""

from datetime import timedelta

import pytest
from django.utils import timezone

from delegation.models import AuditEntry, Budget, Command, Event, Run, RunRollup
from delegation.services import budgets, run_tokens
from delegation.wire import RunTokenParams

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(as_):
    return as_("operator", "token")


def kinds(run_id):
    return list(
        Event.objects.filter(run__run_id=run_id).order_by("sequence").values_list("kind", flat=True)
    )


def test_it_pauses_and_resumes_a_subtree_through_one_service(api, world):
    root, child, grandchild = world.root["runId"], world.child["runId"], world.grandchild["runId"]
    live_before = RunRollup.objects.get(run__run_id=root).sub_running

    response = api.post(f"/api/runs/{root}/pause", {"subtree": True, "reason": "lunch"})
    assert response.status_code == 200, response.content
    report = response.json()
    assert report["outcome"] == "paused"
    outcomes = {d["runId"]: d["outcome"] for d in report["descendants"]}
    assert outcomes[child] == outcomes[grandchild] == "paused"
    for run_id in (root, child, grandchild):
        run = Run.objects.get(run_id=run_id)
        assert run.status == "paused" and run.pause_reason == "lunch"
        assert kinds(run_id)[-1] == "paused"
        command = Command.objects.get(method="run.pause", params__runId=run_id)
        assert command.params == {"runId": run_id, "reason": "lunch"}
    # A paused run is live: the subtree's live count does not move.
    assert RunRollup.objects.get(run__run_id=root).sub_running == live_before
    entry = AuditEntry.objects.get(action="pause-subtree")
    assert (entry.via, entry.target_id, entry.reason, entry.outcome) == (
        "api", root, "lunch", "paused",
    )  # fmt: skip
    shown = api.get(f"/api/runs/{child}").json()
    assert shown["status"] == "paused" and shown["pauseReason"] == "lunch"
    assert shown["pausedAt"] is not None

    again = api.post(f"/api/runs/{child}/pause").json()
    assert again["outcome"] == "already-paused"
    assert Command.objects.filter(method="run.pause", params__runId=child).count() == 1

    resumed = api.post(f"/api/runs/{root}/resume", {"subtree": True}).json()
    assert resumed["outcome"] == "resumed"
    assert {d["outcome"] for d in resumed["descendants"]} >= {"resumed"}
    for run_id in (root, child, grandchild):
        run = Run.objects.get(run_id=run_id)
        assert run.status == "running" and run.paused_at is None and run.paused_seconds > 0
        assert kinds(run_id)[-2:] == ["paused", "resumed"]
        assert Command.objects.get(method="run.resume", params__runId=run_id).params == {
            "runId": run_id
        }
    assert api.post(f"/api/runs/{child}/resume").json()["outcome"] == "not-paused"
    assert AuditEntry.objects.filter(action="resume").get().outcome == "not-paused"


def test_it_refuses_a_viewer_and_finished_runs_say_so(as_, api, world):
    viewer = as_("viewer", "token")
    child = world.child["runId"]
    assert viewer.post(f"/api/runs/{child}/pause").status_code == 403
    assert Run.objects.get(run_id=child).status == "running"
    assert AuditEntry.objects.get(action="pause").outcome == "refused: not an operator"
    finished = world.finished["runId"]
    assert api.post(f"/api/runs/{finished}/pause").json()["outcome"] == "already-finished"
    bad = api.post(f"/api/runs/{child}/pause", {"subtree": "yes"})
    assert bad.status_code == 422
    assert api.post(f"/api/runs/{child}/pause", {"cascade": True}).status_code == 422


def test_it_does_not_count_paused_time_toward_max_seconds(api, world):
    root = Run.objects.get(run_id=world.root["runId"])
    started = timezone.now() - timedelta(seconds=100)
    Run.objects.filter(pk=root.pk).update(created_at=started)
    Budget.objects.create(run=root, max_seconds=90)
    api.post(f"/api/runs/{root.run_id}/pause", {"subtree": True})
    # Paused for 60 of its 100 seconds: 40 s ran, under 80% of 90 s: nothing happens.
    Run.objects.filter(pk=root.pk).update(paused_at=timezone.now() - timedelta(seconds=60))
    assert budgets.sweep_budgets() == []
    assert Run.objects.get(pk=root.pk).status == "paused"
    # Once the pause is shorter than the overrun, the budget stops the subtree.
    Run.objects.filter(pk=root.pk).update(paused_at=timezone.now() - timedelta(seconds=5))
    assert budgets.sweep_budgets() == [root.pk]
    assert "budget-exceeded" in kinds(root.run_id)


def test_it_keeps_a_paused_runs_token_alive_for_its_pending_calls(api, world):
    child = world.child["runId"]
    issued = run_tokens.issue_run_token(world.conn, RunTokenParams.model_validate({"runId": child}))
    assert run_tokens.authenticate_run_token(issued["token"]).run_id == child
    api.post(f"/api/runs/{child}/pause")
    assert run_tokens.authenticate_run_token(issued["token"]).run_id == child
    api.post(f"/api/runs/{child}/cancel")
    Run.objects.filter(run_id=child).update(status="cancelled")
    assert run_tokens.authenticate_run_token(issued["token"]) is None

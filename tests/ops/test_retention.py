"""Retention (issue 28): a pass deletes exactly what is past the limits, in short batches, keeps
kept trees, and leaves every remaining run's rollups equal to a recount of the record."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from delegation.models import AuditEntry, Event, PurgedRun, RetentionPass, Run, RunRollup
from delegation.selectors import retention as due
from delegation.services.audit import audit
from delegation.services.identity import Actor
from delegation.services.retention import do_retention_pass
from tests.support.concurrency import service_connection
from tests.support.personas import signed_in
from tests.support.retention import age_audit, age_tree, grow_tree, tree_runs
from tests.support.rollups import expected_rollups, stored_rollups

pytestmark = pytest.mark.django_db


@pytest.fixture
def limits(settings):
    settings.EVENT_RETENTION_DAYS = 10
    settings.RUN_RETENTION_DAYS = 30
    settings.AUDIT_RETENTION_DAYS = 60
    return settings


@pytest.fixture
def seeded(limits):
    conn = service_connection("retention")
    trees = {
        "ancient": grow_tree(conn, "ancient"),  # 40 days: the whole tree goes
        "kept": grow_tree(conn, "kept"),  # 40 days, kept: untouched
        "old": grow_tree(conn, "old"),  # 20 days: its transcript goes, its runs stay
        "new": grow_tree(conn, "new"),  # 1 day: untouched
        "live": grow_tree(conn, "live", finish=False),  # running: untouched
    }
    for name, days in (("ancient", 40), ("kept", 40), ("old", 20), ("new", 1)):
        age_tree(trees[name], days)
    Run.objects.filter(run_id="kept").update(keep=True)
    system = Actor.system("test")
    for n in range(5):
        audit(system, "test.old", "run", f"very-old-{n}", "ok")
        audit(system, "test.mid", "run", f"mid-{n}", "ok")
    age_audit(70, action="test.old")
    age_audit(40, action="test.mid")
    return trees


def _events(root_id: str) -> dict[str, int]:
    runs = tree_runs(root_id)
    rows = Event.objects.filter(run__run_id__in=runs)
    return {"text": rows.exclude(kind="usage").count(), "usage": rows.filter(kind="usage").count()}


def _sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0


def test_it_deletes_exactly_what_is_past_the_limits_and_keeps_the_kept(seeded, admin):
    before = {name: _events(name) for name in ("kept", "old", "new", "live")}
    ancient_runs = tree_runs("ancient")
    preview = {kind["kind"]: kind for kind in due.preview()}
    assert preview["runs"]["total"] == len(ancient_runs) == 3
    assert preview["audit entries"]["total"] == 5
    assert preview["events"]["total"] == before["old"]["text"] + 12  # ancient's and old's texts
    page = signed_in(admin).get("/retention/")
    assert page.status_code == 200 and b'data-kind="runs" data-total="3"' in page.content
    deleted_runs = _sample("canopy_retention_deleted_total", kind="runs")

    done = do_retention_pass(batch_size=3)

    # The ancient tree is gone whole, with a tombstone per run; the kept one is untouched.
    assert not Run.objects.filter(run_id__in=ancient_runs).exists()
    assert sorted(PurgedRun.objects.values_list("run_id", flat=True)) == ancient_runs
    assert _events("kept") == before["kept"] and _events("new") == before["new"]
    assert _events("live") == before["live"]
    # The old tree lost its transcript only: its usage events (the rollups' record) stay.
    assert _events("old") == {"text": 0, "usage": before["old"]["usage"]}
    assert (
        Run.objects.filter(run_id__in=tree_runs("old"), events_purged_at__isnull=False).count() == 3
    )
    assert not AuditEntry.objects.filter(action="test.old").exists()
    assert AuditEntry.objects.filter(action="test.mid").count() == 5
    # Every remaining run's rollups equal a recount of what remains.
    assert stored_rollups() == expected_rollups()
    assert not RunRollup.objects.filter(run__isnull=True).exists()
    # Recorded, audited and counted.
    assert (done.runs_deleted, done.trees_deleted, done.audit_deleted) == (3, 1, 5)
    assert done.events_deleted == 12 + 3 + before["old"]["text"]  # + ancient's usage events
    assert done.batches > 5 and done.finished_at is not None and done.error == ""
    entry = AuditEntry.objects.get(action="retention.pass")
    assert entry.target_id == str(done.pk) and entry.detail["runs"] == 3
    assert _sample("canopy_retention_deleted_total", kind="runs") == deleted_runs + 3
    # A second pass finds nothing.
    again = do_retention_pass()
    assert again.rows_deleted == 0 and RetentionPass.objects.count() == 2


def test_it_says_a_purged_run_was_purged_instead_of_404(seeded, viewer):
    child = tree_runs("ancient")[-1]
    do_retention_pass()
    client = signed_in(viewer)
    for url in (f"/runs/{child}/", "/trees/ancient/"):
        page = client.get(url)
        assert page.status_code == 410
        assert b"was purged by retention" in page.content
    assert client.get("/runs/never-existed/").status_code == 404


def test_it_lets_only_admins_keep_a_tree_and_audits_it(seeded, admin, operator):
    refused = signed_in(operator, csrf=False).post("/retention/keep/", {"run_id": "ancient"})
    assert refused.status_code == 403
    assert AuditEntry.objects.filter(
        action="retention.keep", outcome="refused: not an admin"
    ).exists()
    assert signed_in(operator).get("/retention/").status_code == 403
    kept = signed_in(admin).post("/retention/keep/", {"run_id": "ancient", "keep": "1"})
    assert kept.status_code == 302 and Run.objects.get(run_id="ancient").keep
    do_retention_pass()
    assert len(tree_runs("ancient")) == 3  # exempt now
    assert Event.objects.filter(run__run_id="ancient").exists()
    assert stored_rollups() == expected_rollups()


def test_it_leaves_a_tree_with_a_run_still_going(limits):
    conn = service_connection("retention-live")
    root = grow_tree(conn, "half", finish=False)
    children = [r for r in tree_runs("half") if r != "half"]
    from delegation.runner_socket import methods

    methods.finish_run(conn, {"runId": children[0], "output": "x"})
    methods.finish_run(conn, {"runId": "half", "output": "x"})
    age_tree(root, 40)
    Run.objects.filter(run_id=children[1]).update(finished_at=None)
    assert Run.objects.get(run_id=children[1]).status == "running"
    do_retention_pass()
    assert len(tree_runs("half")) == 3
    assert stored_rollups() == expected_rollups()

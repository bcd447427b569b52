"""Retention in the server's upkeep loop (issue 28): a real daphne runs passes on its own, in
small batches, while a runner keeps streaming into another tree; not one frame fails, and the
pass is counted in /metrics. On both backends (the suite's PostgreSQL pass runs it there)."""

from __future__ import annotations

import time

import pytest
import requests

from delegation.models import Event, RetentionPass, Run
from delegation.services import tokens
from tests.support.browser import ScriptedRunner
from tests.support.concurrency import service_connection
from tests.support.retention import age_tree, grow_tree, tree_runs
from tests.support.rollups import expected_rollups, stored_rollups

pytestmark = pytest.mark.django_db(transaction=True)

RETENTION_ENV = {
    "EVENT_RETENTION_DAYS": 10,
    "RUN_RETENTION_DAYS": 30,
    "AUDIT_RETENTION_DAYS": 60,
    "RETENTION_INTERVAL_SECONDS": 2,  # the first pass starts once streaming has
    "RETENTION_BATCH_SIZE": 25,
    "RETENTION_BATCH_PAUSE_SECONDS": 0.03,
}


def test_it_runs_passes_in_the_upkeep_loop_while_ingest_continues(daphne_factory):
    conn = service_connection("retention-seed")
    old = [grow_tree(conn, f"old-{n}", texts=60) for n in range(3)]
    for root in old:
        age_tree(root, 40)
    stripped = grow_tree(conn, "stripped", texts=60)
    age_tree(stripped, 20)
    doomed = [run for root in old for run in tree_runs(root.run_id)]
    server = daphne_factory(**RETENTION_ENV)
    _runner, token = tokens.create_runner("streaming")
    runner = ScriptedRunner(f"ws://127.0.0.1:{server.port}/ws/runner/", token).start()
    try:
        runner.open("streaming")
        frames, deadline = 0, time.monotonic() + 60
        # Stream until the loop has finished a pass, then a little more.
        while time.monotonic() < deadline:
            done = RetentionPass.objects.filter(finished_at__isnull=False).first()
            answer = runner.emit(
                "streaming",
                {"kind": "text", "text": f"frame {frames}"},
                {"kind": "usage", "input": {"inputTokens": 1, "outputTokens": 1}},
            )
            frames += 1
            assert answer["emitted"] == 2 * frames, answer  # every frame stored, none refused
            if done is not None and frames > 20:
                break
        assert done is not None, "no retention pass finished within a minute"
        assert done.error == "" and done.batches > 10
    finally:
        runner.close()
    assert not Run.objects.filter(run_id__in=doomed).exists()
    assert Event.objects.filter(run__run_id="stripped").exclude(kind="usage").count() == 0
    streamed = Event.objects.filter(run__run_id="streaming")
    assert streamed.count() == 2 * frames
    # Frames were stored while the pass ran, not only before or after it.
    during = streamed.filter(created_at__gt=done.started_at, created_at__lt=done.finished_at)
    assert during.count() >= 2, (done.started_at, done.finished_at)
    assert stored_rollups() == expected_rollups()
    metrics = requests.get(f"{server.http_url}/metrics", timeout=10).text
    assert 'canopy_retention_passes_total{outcome="ok"}' in metrics
    assert 'canopy_retention_deleted_total{kind="runs"}' in metrics

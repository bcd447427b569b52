"""Rollups recounted from the record (SPEC §10): the usage events' ``input``, the runs'
statuses and parents, never the rollup columns under test."""

from __future__ import annotations

from collections import defaultdict

from delegation.models import Event, Run, RunRollup
from delegation.services import rollups

STATUSES = ("running", "succeeded", "failed", "cancelled", "lost")


def expected_rollups() -> dict[int, dict]:
    runs = list(Run.objects.values("pk", "parent_id", "status", "finished_at"))
    own = defaultdict(lambda: defaultdict(int))
    for run_pk, data in Event.objects.filter(kind="usage").values_list("run_id", "input"):
        figures = own[run_pk]
        figures["tokens_in"] += data["inputTokens"]
        figures["tokens_out"] += data["outputTokens"]
        figures["cache_read"] += data.get("cacheReadTokens", 0)
        figures["cost_nanos"] += rollups.cost_nanos(data.get("costUsd", 0))
        figures["events"] += 1
    parent = {run["pk"]: run["parent_id"] for run in runs}
    expected = {
        run["pk"]: {
            "own_tokens_in": own[run["pk"]]["tokens_in"],
            "own_cost_nanos": own[run["pk"]]["cost_nanos"],
            "own_usage_events": own[run["pk"]]["events"],
            "sub_tokens_in": 0,
            "sub_tokens_out": 0,
            "sub_cache_read": 0,
            "sub_cost_nanos": 0,
            **{f"sub_{status}": 0 for status in STATUSES},
            "sub_last_finished_at": None,
        }
        for run in runs
    }
    for run in runs:
        node = run["pk"]
        while node is not None:  # add the run to itself and every ancestor
            totals = expected[node]
            totals["sub_tokens_in"] += own[run["pk"]]["tokens_in"]
            totals["sub_tokens_out"] += own[run["pk"]]["tokens_out"]
            totals["sub_cache_read"] += own[run["pk"]]["cache_read"]
            totals["sub_cost_nanos"] += own[run["pk"]]["cost_nanos"]
            totals[f"sub_{run['status']}"] += 1
            if run["finished_at"] is not None:
                last = totals["sub_last_finished_at"]
                totals["sub_last_finished_at"] = max(last or run["finished_at"], run["finished_at"])
            node = parent[node]
    return expected


def stored_rollups() -> dict[int, dict]:
    columns = list(next(iter(expected_rollups().values())).keys()) if Run.objects.exists() else []
    return {row.pop("pk"): row for row in RunRollup.objects.values("pk", *columns)}

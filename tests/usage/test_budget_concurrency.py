"""SPEC §10 under parallel writers on PostgreSQL: budgets admit exactly their limit, rollups
lose no update. Threads call the runner socket's service functions on their own connections,
released together by a barrier (``tests.support.concurrency``). SQLite has one writer, so these
run on PostgreSQL only; the same rules are tested over the socket on both backends in
``test_budgets``.

Today child.start also holds its runner's row lock, and a tree has one runner, so that lock
alone serialises these starts; the budget's own lock is what holds when a start path does not
take it (checked by hand: without the runner lock these pass, without both 8 of 6 start)."""

from __future__ import annotations

import pytest

from delegation.models import Run, RunRollup
from delegation.runner_socket import methods
from tests.support.concurrency import in_threads, parallel_writers, service_connection, start_params

pytestmark = [pytest.mark.django_db(transaction=True), parallel_writers]


def _tree(conn, budget: dict, parents: int = 4) -> list[str]:
    methods.open_run(conn, {"conversationId": "conv-root", "runId": "root", "budget": budget})
    return [
        methods.child_start(conn, start_params("root", f"p{i}"))["runId"] for i in range(parents)
    ]


@pytest.mark.parametrize(
    ("budget", "admitted"),
    [({"maxRuns": 10}, 6), ({"maxLive": 7}, 3)],
    ids=["maxRuns", "maxLive"],
)
def test_it_admits_exactly_the_limit_under_20_parallel_starts(settings, budget, admitted):
    settings.DELEGATION_MAX_CONCURRENT = 64
    conn = service_connection()
    parents = _tree(conn, budget)  # four descendants already: they count

    def work(i):
        # Spread over four parents, so the parents' own row locks do not serialise them:
        # only the budget's lock stands between these starts.
        return methods.child_start(conn, start_params(parents[i % 4], f"c{i}"))["runId"]

    results = in_threads(20, work)
    outcomes = sorted(result[0] for result in results)
    assert [r for r in results if r[0] not in ("ok", "rpc")] == []
    assert outcomes.count("ok") == admitted, results
    assert all(code == -32017 for kind, code in results if kind == "rpc"), results
    assert Run.objects.filter(parent__run_id__in=parents).count() == admitted
    root = RunRollup.objects.get(run__run_id="root")
    assert root.sub_runs == 1 + 4 + admitted == Run.objects.count()
    assert root.sub_running == Run.objects.filter(status="running").count()


def test_it_loses_no_rollup_update_with_parallel_usage_across_a_tree(settings):
    settings.DELEGATION_MAX_CONCURRENT = 64
    conn = service_connection()
    parents = _tree(conn, {"maxTokens": 10**9})
    leaves = [
        methods.child_start(conn, start_params(parents[i % 4], f"leaf{i}"))["runId"]
        for i in range(16)
    ]
    frames = 6

    def work(i):
        # Leaves and their parents report at once, so chains overlap at every level.
        run_id = leaves[i] if i < 16 else parents[i - 16]
        for n in range(frames):
            methods.append_event_frame(
                conn,
                {
                    "runId": run_id,
                    "from": n + 1,
                    "events": [
                        {
                            "kind": "usage",
                            "input": {"inputTokens": 3, "outputTokens": 1, "costUsd": 0.001},
                        }
                    ],
                },
            )
        return run_id

    results = in_threads(20, work)
    assert all(kind == "ok" for kind, *_ in results), results
    root = RunRollup.objects.get(run__run_id="root")
    assert (root.sub_tokens_in, root.sub_tokens_out) == (20 * frames * 3, 20 * frames)
    assert root.sub_cost_nanos == 20 * frames * 1_000_000
    for parent in parents:
        rollup = RunRollup.objects.get(run__run_id=parent)
        assert rollup.sub_tokens_in == (4 + 1) * frames * 3
        assert rollup.own_tokens_in == frames * 3

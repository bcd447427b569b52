"""Property (SPEC §10): for random trees with random usage events and status changes, after
every call each run's rollup equals what its descendants' stored rows add up to.

The expected figures are recomputed from the record itself (the usage events' `input`, the
runs' statuses and parents), never from the rollup columns under test. The calls are the
runner socket's service functions, on the test database.
"""

from __future__ import annotations

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delegation.errors import RpcError
from delegation.models import Run
from delegation.runner_socket import methods
from delegation.services import runners
from tests.support.concurrency import service_connection, start_params
from tests.support.rollups import expected_rollups, stored_rollups

pytestmark = pytest.mark.django_db

operation = st.one_of(
    st.tuples(st.just("start"), st.integers(0, 10**6)),
    st.tuples(
        st.just("usage"),
        st.integers(0, 10**6),
        st.lists(
            st.tuples(
                st.integers(0, 5000),
                st.integers(0, 5000),
                st.integers(0, 300),
                st.floats(0, 3, allow_nan=False, allow_infinity=False),
            ),
            min_size=1,
            max_size=4,
        ),
    ),
    st.tuples(st.just("finish"), st.integers(0, 10**6), st.sampled_from(["ok", "error", "cancel"])),
    st.tuples(st.just("root"), st.integers(0, 10**6)),
    st.tuples(st.just("rehost"), st.integers(0, 10**6)),
)


class World:
    def __init__(self):
        self.conn = service_connection("prop")
        self.roots = 0
        self.hosts = 1

    def runs(self, live_only=False) -> list[Run]:
        runs = Run.objects.order_by("pk")
        if live_only:
            runs = runs.filter(status="running")
        return list(runs)

    def apply(self, op) -> None:
        kind, pick = op[0], op[1]
        try:
            if kind == "root" or not Run.objects.exists():
                self.roots += 1
                methods.open_run(
                    self.conn, {"conversationId": f"c{self.roots}", "runId": f"root{self.roots}"}
                )
            elif kind == "start":
                live = self.runs(live_only=True)
                if live:
                    parent = live[pick % len(live)]
                    methods.child_start(
                        self.conn, start_params(parent.run_id, f"q{pick}-{parent.pk}")
                    )
            elif kind == "usage":
                runs = self.runs()
                run = runs[pick % len(runs)]
                events = [
                    {
                        "kind": "usage",
                        "input": {
                            "inputTokens": a,
                            "outputTokens": b,
                            "cacheReadTokens": c,
                            "costUsd": cost,
                        },
                    }
                    for a, b, c, cost in op[2]
                ]
                methods.append_event_frame(
                    self.conn, {"runId": run.run_id, "from": run.emitted + 1, "events": events}
                )
            elif kind == "finish":
                live = self.runs(live_only=True)
                if live:
                    run = live[pick % len(live)]
                    fields = {"ok": {"output": "x"}, "error": {"error": "e"}, "cancel": {}}[op[2]]
                    if op[2] == "cancel":
                        fields["cancelled"] = True
                    methods.finish_run(self.conn, {"runId": run.run_id, **fields})
            elif kind == "rehost":
                # A new host instance: every live run of the old one is lost in one transaction.
                self.hosts += 1
                _result, generation, _ = methods.register(
                    self.conn,
                    {
                        "hostInstanceId": f"host-{self.hosts}",
                        "extensions": [
                            {"extensionId": "ext", "generation": 1, "presets": [{"name": "worker"}]}
                        ],
                    },
                )
                self.conn = runners.Connection(
                    runner_pk=self.conn.runner_pk,
                    generation=generation,
                    channel_name=self.conn.channel_name,
                )
        except RpcError:
            pass  # a refusal (depth, caps) writes no usage or status: still checked below


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(operation, min_size=1, max_size=30))
def test_it_keeps_every_subtree_total_equal_to_the_sum_over_its_descendants(ops):
    with transaction.atomic():
        world = World()
        for step, op in enumerate(ops):
            world.apply(op)
            expected = expected_rollups()
            stored = stored_rollups()
            assert stored == expected, f"after step {step} {op[0]}"
        transaction.set_rollback(True)

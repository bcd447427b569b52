"""Every list and the tree run a fixed number of SQL queries, whatever the number of runs
(no N+1): measured on a small tree and on a tree of a few hundred runs."""

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from delegation.models import AuditEntry, Event, Lease, Run, Session
from delegation.services import tokens

pytestmark = pytest.mark.django_db


def bulk_tree(name: str, size: int, fanout: int = 7) -> Run:
    """A tree of ``size`` runs (breadth first, ``fanout`` children each), with a session per
    run, a lease per parent, two events per run and an audit entry per run."""
    runner, _ = tokens.create_runner(f"runner-{name}")
    now = timezone.now()
    sessions = Session.objects.bulk_create(
        Session(conversation_id=f"{name}-c{i}", runner=runner, depth=0, created_at=now)
        for i in range(size)
    )
    root = Run.objects.create(
        run_id=f"{name}-r0", session=sessions[0], runner=runner, depth=0, created_at=now
    )
    runs = [root]
    leases = {}
    for index in range(1, size):
        parent = runs[(index - 1) // fanout]
        if parent.pk not in leases:
            leases[parent.pk] = Lease.objects.create(
                runner=runner, lease_id=f"{name}-l{parent.pk}", extension_id="ext",
                generation=1, parent_run=parent, expires_at=now + timedelta(hours=1),
            )  # fmt: skip
        session = sessions[index]
        session.parent_id = parent.session_id
        session.depth = parent.depth + 1
        run = Run(
            run_id=f"{name}-r{index}", session=session, runner=runner, parent=parent,
            root=root, depth=parent.depth + 1, lease=leases[parent.pk],
            status=("running", "succeeded", "failed")[index % 3],
            created_at=now + timedelta(microseconds=index),
        )  # fmt: skip
        run.save()
        runs.append(run)
    Session.objects.bulk_update(sessions, ["parent", "depth"])
    Event.objects.bulk_create(
        Event(run=run, sequence=seq, kind="text", text=f"{run.run_id} says {seq}")
        for run in runs
        for seq in (1, 2)
    )
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(last_sequence=2)
    AuditEntry.objects.bulk_create(
        AuditEntry(actor="user:x", via="api", action="cancel", target_type="run",
                   target_id=run.run_id, outcome="requested")
        for run in runs
    )  # fmt: skip
    return root


def fill(params, root: Run) -> dict:
    return {k: v.format(root=root.run_id) if isinstance(v, str) else v for k, v in params.items()}


def count(api, path: str, params=None) -> tuple[int, object]:
    with CaptureQueriesContext(connection) as queries:
        response = api.get(path, params)
        # A streamed body (the subtree) runs its queries while it is read.
        body = response.getvalue()
    assert response.status_code == 200, body
    return len(queries), json.loads(body)


ENDPOINTS = [
    ("/api/runs", {"limit": 1000}),
    ("/api/runs", {"root": "{root}", "limit": 1000}),
    ("/api/runs", {"q": "says", "status": "running", "limit": 1000}),
    ("/api/runs/{root}/tree", None),
    ("/api/runs/{root}", None),
    ("/api/runs/{root}/events", None),
    ("/api/sessions", {"limit": 1000}),
    ("/api/leases", {"limit": 1000}),
    ("/api/runners", None),
    ("/api/audit", {"limit": 1000}),
]


@pytest.mark.parametrize("mode", ["token", "session"])
def test_it_runs_a_fixed_number_of_queries_whatever_the_tree_size(
    as_, mode, django_assert_max_num_queries
):
    api = as_("viewer", mode)
    # A token's last-used time is written at most once a minute: spend that write first so
    # every measured request is alike.
    count(api, "/api/runners", {})
    small = bulk_tree("small", 8)
    measured = {}
    for path, params in ENDPOINTS:
        filled = fill(params or {}, small)
        measured[(path, str(params))] = count(api, path.format(root=small.run_id), filled)[0]

    big = bulk_tree("big", 400)
    for path, params in ENDPOINTS:
        filled = fill(params or {}, big)
        with django_assert_max_num_queries(6):
            queries, body = count(api, path.format(root=big.run_id), filled)
        # The same queries as for a tree fifty times smaller: nothing per row.
        assert queries == measured[(path, str(params))], (path, params)
        if path == "/api/runs/{root}/tree":
            assert sum(1 for _ in walk(body)) == 400
        elif path == "/api/runs" and params.get("root"):
            assert len(body["items"]) == 400
    print(f"\nqueries per request ({mode} auth):", measured)


def walk(node):
    yield node
    for child in node["children"]:
        yield from walk(child)

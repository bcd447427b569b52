"""Database-side steps of the benchmark, run in a child process against the bench database.

python -m bench.seed ceiling --rows N --batch B
python -m bench.seed driver-ceiling --rows N --batch B [--writers W]
python -m bench.seed big-run --events N
python -m bench.seed tree --runs N
python -m bench.seed subtree --run RUN_ID
python -m bench.seed runners --runs N      # N runner tokens, one per fleet socket
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import uuid

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "canopy.settings")

import django  # noqa: E402

django.setup()

from django.db import OperationalError, connection, transaction  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from delegation.models import Event, Run, RunStatus, Session  # noqa: E402
from delegation.runner_socket import methods  # noqa: E402
from delegation.services import event_store, runners, tokens  # noqa: E402

EXTENSION = {"extensionId": "bench", "generation": 1, "presets": [{"name": "worker"}]}
TEXT = "hello world " * 4


def _registered_runner(name: str):
    runner, token = tokens.create_runner(name)
    conn = runners.Connection(runner_pk=runner.pk)
    _, generation, _ = methods.register(
        conn, {"hostInstanceId": "bench", "extensions": [EXTENSION]}
    )
    return runner, token, runners.Connection(runner_pk=runner.pk, generation=generation)


def _ceiling_run() -> Run:
    """An open run of a registered runner, for the ceilings to insert its rows into."""
    _runner, _token, conn = _registered_runner(f"ceiling-{uuid.uuid4().hex[:8]}")
    run_id = f"ceiling-{uuid.uuid4().hex}"
    methods.open_run(conn, {"conversationId": f"c-{run_id}", "runId": run_id})
    return Run.objects.get(run_id=run_id)


def ceiling(rows: int, batch: int) -> dict:
    """The ORM's raw bulk_create rate for the rows ingest stores, on this database."""
    run = _ceiling_run()
    now = timezone.now()
    started = time.perf_counter()
    sequence = 0
    while sequence < rows:
        objects = []
        for _ in range(min(batch, rows - sequence)):
            sequence += 1
            objects.append(
                Event(
                    run=run,
                    sequence=sequence,
                    runner_index=sequence,
                    kind="text-delta",
                    text=TEXT,
                    created_at=now,
                )
            )
        with transaction.atomic():
            Event.objects.bulk_create(objects)
    elapsed = time.perf_counter() - started
    return {"rows_per_s": rows / elapsed}


def driver_ceiling(rows: int, batch: int, writers: int = 1) -> dict:
    """The database driver's own bulk insert of the same rows, past Django entirely: sqlite3's
    ``executemany`` or psycopg's ``COPY``, one transaction per ``batch`` rows as ingest commits
    one per frame, from ``writers`` threads with a connection and a run each. What no server
    can beat; ingest is measured as a fraction of it."""
    runs = [_ceiling_run() for _ in range(writers)]
    connection.close()  # each writer thread opens its own
    share = rows // writers
    now = timezone.now()
    target = f"{Event._meta.db_table} ({', '.join(event_store.EVENT_COLUMNS)})"
    placeholders = ", ".join("?" * len(event_store.EVENT_COLUMNS))

    def write(run: Run):
        connection.ensure_connection()
        raw = connection.connection
        stamp = connection.ops.adapt_datetimefield_value(now)  # SQLite stores it as text
        for first in range(1, share + 1, batch):
            numbers = range(first, min(share, first + batch - 1) + 1)
            if connection.vendor == "postgresql":
                with raw.cursor() as cursor:
                    with cursor.copy(f"COPY {target} FROM STDIN") as copy:
                        for n in numbers:
                            copy.write_row((run.pk, n, n, now, "text-delta", TEXT, *_NO_FIELDS))
            else:
                cursor = raw.cursor()
                cursor.execute("BEGIN")  # Django left the driver in autocommit
                cursor.executemany(
                    f"INSERT INTO {target} VALUES ({placeholders})",
                    [(run.pk, n, n, stamp, "text-delta", TEXT, *_NO_FIELDS) for n in numbers],
                )
            raw.commit()
        connection.close()

    threads = [threading.Thread(target=write, args=(run,)) for run in runs]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    stored = Event.objects.filter(run__in=runs).count()
    assert stored == share * writers, f"driver ceiling stored {stored} of {share * writers} rows"
    return {"rows_per_s": share * writers / elapsed}


# tool_name, tool_call_id, input, tool_output, success, error; then truncated and actor.
_NO_FIELDS = (None, None, None, None, None, None, False, "")


def big_run(events: int) -> dict:
    """A child whose stream holds ``events`` events, for child.read at both ends."""
    _runner, token, conn = _registered_runner("reader")
    methods.open_run(conn, {"conversationId": "c-reader-root", "runId": "reader-root"})
    child = methods.child_start(
        conn,
        {
            "runId": "reader-root",
            "extensionId": "bench",
            "generation": 1,
            "request": {"requestId": "big", "profile": "worker", "message": "stream a lot"},
        },
    )
    run = Run.objects.get(run_id=child["runId"])
    now = timezone.now()
    batch = 5000
    row = {
        "kind": "text-delta",
        "text": TEXT,
        "tool_name": None,
        "tool_call_id": None,
        "input": None,
        "tool_output": None,
        "success": None,
        "error": None,
        "truncated": False,
    }
    for first in range(1, events + 1, batch):
        last = min(events, first + batch - 1)
        with transaction.atomic():
            event_store.insert_events([(run.pk, n, n, now, row) for n in range(first, last + 1)])
    Run.objects.filter(pk=run.pk).update(last_sequence=events, emitted=events)
    return {"token": token, "runId": "reader-root", "childId": child["conversationId"]}


def tree(runs: int) -> dict:
    """A delegation tree of ``runs`` runs (fan-out 10), plus an operator API token."""
    runner, _token, conn = _registered_runner("tree")
    methods.open_run(conn, {"conversationId": "c-tree-root", "runId": "tree-root"})
    root = Run.objects.get(run_id="tree-root")
    now = timezone.now()
    level = [root]
    made = 1
    while made < runs:
        next_level = []
        for parent in level:
            for _ in range(10):
                if made >= runs:
                    break
                made += 1
                key = uuid.uuid4().hex
                session = Session(
                    conversation_id=f"c-{key}",
                    runner=runner,
                    depth=parent.depth + 1,
                    parent_id=parent.session_id,
                    created_at=now,
                )
                next_level.append((parent, session, key))
        Session.objects.bulk_create([s for _, s, _ in next_level])
        created = Run.objects.bulk_create(
            [
                Run(
                    run_id=f"r-{key}",
                    session=session,
                    runner=runner,
                    parent=parent,
                    root=root,
                    depth=parent.depth + 1,
                    status=RunStatus.SUCCEEDED if made % 3 else RunStatus.RUNNING,
                    done=bool(made % 3),
                    created_at=now,
                    updated_at=now,
                )
                for parent, session, key in next_level
            ]
        )
        level = created
    return {"root": "tree-root", "runs": made, **operator()}


def runners_tokens(count: int) -> dict:
    """``count`` runners, one token each: a runner has one current connection (``register``
    fences the older ones), so a fleet of sockets needs a runner per socket."""
    return {"tokens": [tokens.create_runner(f"fleet-{i}")[1] for i in range(count)]}


def operator() -> dict:
    """An operator account with an API token, for live sockets and pages."""
    from django.contrib.auth.models import Group, User

    user, _ = User.objects.get_or_create(username="bench-operator")
    user.set_password("bench-password")
    user.save()
    user.groups.add(Group.objects.get(name="operator"))
    _, api_token = tokens.create_api_token(user, "bench")
    return {"username": "bench-operator", "password": "bench-password", "apiToken": api_token}


def subtree(run_id: str) -> dict:
    """REST subtree time (median of 5, in process) and its SQL query count."""
    from django.test import Client

    from delegation.models import ApiToken

    token = tokens.create_api_token(ApiToken.objects.first().user, "subtree")[1]
    client = Client(headers={"authorization": f"Bearer {token}"})
    url = f"/api/runs/{run_id}/tree"
    client.get(url).getvalue()  # warm caches and imports
    times = []
    for _ in range(5):
        started = time.perf_counter()
        response = client.get(url)
        body = response.getvalue()  # the subtree streams: time it to its last byte
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, body[:300]
    with CaptureQueriesContext(connection) as queries:
        client.get(url).getvalue()
    return {"subtree_ms": statistics.median(times), "subtree_queries": len(queries)}


def tree_bulk(runs: int) -> dict:
    """A tree of ``runs`` runs written with bulk SQL (bench.tree_seed), plus an operator."""
    from bench.tree_seed import seed_tree
    from delegation.models import Runner

    runner, _token, _conn = _registered_runner("tree-bulk")
    tree = seed_tree(runner, runs, prefix="bulk")
    # No socket will ever hold this runner: left "connected", the server's sweep would find it
    # silent, then lost, and mark its 33,000 running runs lost in one long write mid-bench.
    Runner.objects.filter(pk=runner.pk).update(connected=False, disconnected_at=None)
    return {"root": tree["root"], "runs": runs, "last": tree["last"], **operator()}


def subtree_big(run_id: str, runs: int) -> dict:
    """The REST subtree of a big tree, read to its last byte (median of 3, in process)."""
    from django.test import Client

    from delegation.models import ApiToken

    token = tokens.create_api_token(ApiToken.objects.first().user, "subtree-big")[1]
    client = Client(headers={"authorization": f"Bearer {token}"})
    url = f"/api/runs/{run_id}/tree"
    times = []
    for _ in range(3):
        started = time.perf_counter()
        response = client.get(url)
        body = response.getvalue()
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, body[:300]
    assert json.loads(body)["runId"] == run_id
    median = statistics.median(times)
    return {"subtree_ms_100k": median, "subtree_rows_per_s_100k": runs / (median / 1000)}


def churn(root: str, per_second: int, seconds: float) -> dict:
    """Change ``per_second`` runs of the tree a second (status flips, as a busy tree's
    runs finish), committed one by one; what a live page must keep up with."""
    from delegation.models import Run

    pks = list(Run.objects.filter(root__run_id=root).values_list("pk", flat=True))
    started = time.perf_counter()
    done = 0
    while time.perf_counter() - started < seconds:
        due = int((time.perf_counter() - started) * per_second)
        while done < due:
            pk = pks[(done * 7919) % len(pks)]
            try:
                Run.objects.filter(pk=pk).update(
                    # Statuses the seed never uses: every update is a real change to a row.
                    status=RunStatus.FAILED if done % 2 else RunStatus.CANCELLED,
                    updated_at=timezone.now(),
                )
            except OperationalError:  # SQLite: the server's sweep holds the write lock
                time.sleep(0.01)
                continue
            done += 1
        time.sleep(0.005)
    return {"changed": done, "seconds": time.perf_counter() - started}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("step")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--run")
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    if args.step == "ceiling":
        result = ceiling(args.rows, args.batch)
    elif args.step == "driver-ceiling":
        result = driver_ceiling(args.rows, args.batch, args.writers)
    elif args.step == "big-run":
        result = big_run(args.events)
    elif args.step == "tree":
        result = tree(args.runs)
    elif args.step == "runners":
        result = runners_tokens(args.runs)
    elif args.step == "operator":
        result = operator()
    elif args.step == "subtree":
        result = subtree(args.run)
    elif args.step == "tree-bulk":
        result = tree_bulk(args.runs)
    elif args.step == "subtree-big":
        result = subtree_big(args.run, args.runs)
    elif args.step == "churn":
        result = churn(args.run, args.rate, args.seconds)
    else:
        parser.error(f"unknown step {args.step}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Retention (issue 28): a pass's rate (rows deleted per second), alone and inside the server's
upkeep loop, and ingest while that pass runs against ingest without one, on SQLite and
PostgreSQL.

python -m bench retention            # via the bench driver (both backends)
python -m bench.retention seed|pass|last-pass   # the database-side steps (child processes)

The seed is finished trees aged past the limits (bulk SQL: bench.tree_seed plus events); the
server's pass uses the default batch size and pause; ingest is bench.ingest's race.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time

RETENTION_TREES = 40
RETENTION_TREE_RUNS = 10
RETENTION_EVENTS_PER_RUN = 150
RETENTION_ENV = {
    "EVENT_RETENTION_DAYS": "10",
    "RUN_RETENTION_DAYS": "30",
    "AUDIT_RETENTION_DAYS": "60",
}


def _django():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "canopy.settings")
    import django

    django.setup()


def seed(tag: str = "a") -> dict:
    """Finished trees, half aged past the run limit (deleted whole), half past the event limit
    only (transcripts stripped)."""
    _django()
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from bench.tree_seed import seed_tree
    from delegation.models import Event, Run, Runner
    from delegation.services import tokens

    runner, _ = tokens.create_runner(f"retention-seed-{tag}")
    now = timezone.now()
    for n in range(RETENTION_TREES):
        tree = seed_tree(runner, RETENTION_TREE_RUNS, fanout=5, prefix=f"ret{tag}{n}")
        root = Run.objects.get(run_id=tree["root"])
        runs = Run.objects.filter(pk=root.pk) | Run.objects.filter(root_id=root.pk)
        age = timedelta(days=40 if n % 2 == 0 else 20)
        runs.update(status="succeeded", done=True, finished_at=now - age)
        with transaction.atomic():
            Event.objects.bulk_create(
                [
                    Event(run_id=pk, sequence=i, kind="text", text="hello world " * 8)
                    for pk in runs.values_list("pk", flat=True)
                    for i in range(1, RETENTION_EVENTS_PER_RUN + 1)
                ],
                batch_size=2000,
            )
    Runner.objects.filter(pk=runner.pk).update(connected=False, disconnected_at=None)
    return {"events": Event.objects.count(), "runs": Run.objects.count()}


def run_pass() -> dict:
    _django()
    from delegation.services.retention import do_retention_pass

    started = time.perf_counter()
    done = do_retention_pass()
    seconds = time.perf_counter() - started
    return {
        "rows": done.rows_deleted,
        "seconds": seconds,
        "rows_per_s": done.rows_deleted / seconds,
    }


def last_pass() -> dict:
    _django()
    from delegation.models import RetentionPass

    # The first pass: it found the seed; the later ones (every interval) find nothing left.
    done = RetentionPass.objects.filter(finished_at__isnull=False).order_by("started_at").first()
    if done is None:
        return {}
    return {
        "rows": done.rows_deleted,
        "seconds": done.seconds,
        "started": done.started_at.timestamp(),
    }


# --- the driver side ---------------------------------------------------------------------


def _ingest_round(url: str, tokens: list[str], tag: str) -> float:
    from bench.ingest import INGEST_BATCH, _race
    from bench.rpc import TEXT

    async def prepare(index, runner):
        await runner.register()
        run_id = f"ingest-{tag}-{index}"
        await runner.call("run.open", {"conversationId": f"c-{run_id}", "runId": run_id})
        return run_id, [{"kind": "text-delta", "text": TEXT} for _ in range(INGEST_BATCH)]

    return asyncio.run(_race(url, tokens, prepare))


def measure(kind: str) -> dict:
    from bench.ingest import INGEST_RUNNERS
    from bench.servers import Database, Server

    db = Database(kind)
    try:
        tokens = [db.runner_token(f"ingest-{i}") for i in range(INGEST_RUNNERS)]
        db.python("bench.retention", "seed")
        # Ingest without a pass (retention off in this server).
        server = Server(db)
        try:
            without = statistics.median(
                _ingest_round(server.ws, tokens, f"off{n}") for n in range(3)
            )
        finally:
            server.stop()
        # The same ingest while the server's own upkeep loop runs a pass over the seed.
        server = Server(db, RETENTION_INTERVAL_SECONDS="0.5", **RETENTION_ENV)
        try:
            during, rounds = [], 0
            while rounds < 20:
                started = time.time()
                rate = _ingest_round(server.ws, tokens, f"on{rounds}")
                rounds += 1
                done = json.loads(db.python("bench.retention", "last-pass"))
                if not done or done["started"] + done["seconds"] > started:
                    during.append(rate)  # this round overlapped the pass
                if done:
                    break
        finally:
            server.stop()
        in_server = done
        # The pass alone, in a row without pauses, over a fresh seed.
        db.python("bench.retention", "seed", "b")
        alone = json.loads(db.python("bench.retention", "pass", **RETENTION_ENV))
    finally:
        db.close()
    return {
        f"retention_{kind}_pass_rows_per_s_alone": round(alone["rows_per_s"]),
        f"retention_{kind}_pass_rows": alone["rows"],
        f"retention_{kind}_pass_rows_per_s_in_server": round(
            in_server["rows"] / in_server["seconds"]
        ),
        f"retention_{kind}_ingest_events_per_s_without_pass": round(without),
        f"retention_{kind}_ingest_events_per_s_during_pass": round(statistics.median(during)),
        f"retention_{kind}_ingest_ratio_during_vs_without": round(
            statistics.median(during) / without, 3
        ),
    }


def retention():
    from bench.table import results

    for kind in ("sqlite", "postgres"):
        results.update(measure(kind))


if __name__ == "__main__":
    step, *rest = sys.argv[1:]
    answer = {"seed": seed, "pass": run_pass, "last-pass": last_pass}[step](*rest)
    print(json.dumps(answer))

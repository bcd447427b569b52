"""Seed a big delegation tree with bulk SQL (executemany, explicit keys): 100,000 runs in a few
seconds, where the ORM's bulk_create would take a minute. Used by the big-tree browser tests
and the bench.

Shape: fan-out ``fanout`` level by level, runs numbered in creation order (``prefix-0`` is the
root). Run ``n`` starts at ``base + n * step_ms`` and, unless it is running (every third), ends
``(n % 97 + 1) * 100`` ms later; its task is ``task n``.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone


def seed_tree(runner, total: int, fanout: int = 10, prefix: str = "big", step_ms: int = 10):
    """Insert a tree of ``total`` runs under a new root; returns a dict describing it."""
    from delegation.models import Run, Session

    base = timezone.now() - timedelta(milliseconds=step_ms * total + 60_000)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {Run._meta.db_table}")
        run_base = cursor.fetchone()[0] + 1
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {Session._meta.db_table}")
        session_base = cursor.fetchone()[0] + 1
    adapt = connection.ops.adapt_datetimefield_value
    parents = [None]
    depths = [0]
    level_start, level_end, n = 0, 1, 1
    while n < total:
        for parent in range(level_start, level_end):
            for _ in range(fanout):
                if n >= total:
                    break
                parents.append(parent)
                depths.append(depths[parent] + 1)
                n += 1
        level_start, level_end = level_end, n
    # One session per depth rather than per run: the tree's rows never read sessions, and
    # this halves the rows to insert.
    deepest = max(depths)
    sessions = [
        (
            session_base + d,
            f"c-{prefix}-d{d}",
            runner.pk,
            d,
            None if d == 0 else session_base + d - 1,
            "ext",
            "worker",
            "",
            adapt(base),
        )
        for d in range(deepest + 1)
    ]
    runs, times = [], {}
    for i in range(total):
        created = base + timedelta(milliseconds=i * step_ms)
        running = i % 3 == 0
        finished = None if running else created + timedelta(milliseconds=(i % 97 + 1) * 100)
        parent = parents[i]
        times[f"{prefix}-{i}"] = (created, finished)
        runs.append(
            (
                run_base + i,
                f"{prefix}-{i}",
                session_base + depths[i],
                runner.pk,
                None if parent is None else run_base + parent,
                None if i == 0 else run_base,
                depths[i],
                "running" if running else "succeeded",
                not running,
                "ext",
                "worker",
                f"task {i}",
                f"step {i % 50}" if i else "",
                i % 50,
                i % 50,
                adapt(created),
                adapt(finished or created),
                adapt(finished) if finished else None,
            )
        )
    empty = ("cancelled", "error", "output", "host_instance_id", "tool_call_id", "request_id")
    empty += ("request_fingerprint", "context_mode", "cwd", "cancel_reason")
    run_columns = (
        "id, run_id, session_id, runner_id, parent_id, root_id, depth, status, done, "
        "extension_id, profile, task, activity, last_sequence, emitted, created_at, "
        "updated_at, finished_at, refused_spawns, options, via, ancestry, " + ", ".join(empty)
    )
    run_values = (
        ", ".join(["%s"] * 18)
        + ", 0, '{}', 'runner', '[]', "
        + ", ".join(["FALSE" if e == "cancelled" else "''" for e in empty])
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {Session._meta.db_table} (id, conversation_id, runner_id, depth, "
            "parent_id, extension_id, profile, host_instance_id, created_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            sessions,
        )
        cursor.executemany(
            f"INSERT INTO {Run._meta.db_table} ({run_columns}) VALUES ({run_values})", runs
        )
        if connection.vendor == "postgresql":
            for model in (Run, Session):
                table = model._meta.db_table
                cursor.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                    f"(SELECT MAX(id) FROM {table}))"
                )
    last_child = {}
    for i, parent in enumerate(parents):
        if parent is not None:
            last_child[parent] = i
    last = 0
    while last in last_child:
        last = last_child[last]
    return {
        "root": f"{prefix}-0",
        "last": f"{prefix}-{last}",
        "total": total,
        "deepest": f"{prefix}-{total - 1}",
        "depth": depths[-1],
        "times": times,
        "parents": parents,
    }

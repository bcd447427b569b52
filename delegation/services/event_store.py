"""The SQL of the ingest hot path: lock the run a frame appends to, insert its events, advance
the run. Every ``run.event`` frame runs these three statements and little else, so they skip
the ORM's query compiler and go to the driver directly: ``COPY`` on PostgreSQL, one multi-row
``INSERT`` on SQLite (``python -m bench ingest`` measures both against the driver's own bulk
insert of the same rows).
"""

from __future__ import annotations

import sqlite3
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connection, connections

from delegation.models import Event, Run, Runner

EVENT_COLUMNS = (
    "run_id",
    "sequence",
    "runner_index",
    "created_at",
    "kind",
    "text",
    "tool_name",
    "tool_call_id",
    "input",
    "tool_output",
    "success",
    "error",
    "truncated",
    "actor",
)
_EVENT_JSON = ("input", "tool_output")

# What appending needs of the run, usage rollups' ancestry included (the rest stays deferred
# on the instance: reading it loads it, and a save writes only what was loaded), then of its
# runner, for the fence check. In the model's field order, which Model.from_db expects.
_RUN_FIELDS = tuple(
    field.attname
    for field in Run._meta.concrete_fields
    if field.attname
    in {
        "id",
        "run_id",
        "runner_id",
        "root_id",
        "parent_id",
        "status",
        "emitted",
        "last_sequence",
        "ancestry",
    }
)
_ANCESTRY = _RUN_FIELDS.index("ancestry")


@cache
def _sql(vendor: str) -> dict[str, str]:
    """The statements, quoted for ``vendor`` once per process."""
    quote = connection.ops.quote_name
    run, runner = Run._meta, Runner._meta
    columns = ", ".join(f"r.{quote(run.get_field(name).column)}" for name in _RUN_FIELDS)
    # OF r: PostgreSQL locks the run only; the runner row is read, as current_runner does.
    lock = " FOR UPDATE OF r" if vendor == "postgresql" else ""
    select = (
        f"SELECT {columns}, u.{quote('revoked_at')}, u.{quote('connection_generation')} "
        f"FROM {quote(run.db_table)} r JOIN {quote(runner.db_table)} u "
        f"ON u.{quote('id')} = r.{quote('runner_id')} "
    )
    return {
        # Several runs of one runner, locked in primary-key order (ancestors first: a parent
        # is created before its child), so two such locks cannot wait on each other.
        "lock_many": (
            f"{select}WHERE (r.{quote('runner_id')}, r.{quote('run_id')}) IN ({{}}) "
            f"ORDER BY r.{quote('id')}{lock}"
        ),
        "update": f"UPDATE {quote(run.db_table)} SET {{}} WHERE {quote('id')} = %s",
        "events": f"{quote(Event._meta.db_table)} ({', '.join(map(quote, EVENT_COLUMNS))})",
    }


@cache
def _assignments(vendor: str, names: tuple[str, ...]) -> str:
    quote = connection.ops.quote_name
    return ", ".join(f"{quote(Run._meta.get_field(name).column)} = %s" for name in names)


def lock_own_runs(runs: list[tuple[int, str]]) -> dict[tuple[int, str], tuple[Run, bool, int]]:
    """The callers' runs, each (runner pk, runId) locked for this transaction with its
    runner's fence state (revoked, connection generation), in one statement and keyed the
    same way (missing: no such run of that runner)."""
    sql = _sql(connection.vendor)["lock_many"].format(", ".join(["(%s, %s)"] * len(runs)))
    with connection.cursor() as cursor:
        cursor.execute(sql, [value for pair in runs for value in pair])
        found = [_locked(row) for row in cursor.fetchall()]
    return {(run.runner_id, run.run_id): (run, revoked, gen) for run, revoked, gen in found}


def _locked(found) -> tuple[Run, bool, int]:
    values = list(found[: len(_RUN_FIELDS)])
    ancestry = Run._meta.get_field("ancestry")
    values[_ANCESTRY] = ancestry.from_db_value(values[_ANCESTRY], None, connection)
    run = Run.from_db(connection.alias, _RUN_FIELDS, values)
    revoked_at, generation = found[len(_RUN_FIELDS) :]
    return run, revoked_at is not None, generation


def save_runs_fields(changes: list[tuple[Run, list[str]]]) -> None:
    """``run.save(update_fields=names)`` of several runs: one ``executemany`` per set of
    fields, compiled once per set, which
    psycopg sends in one round trip (pipeline mode)."""
    db = connections[DEFAULT_DB_ALIAS]  # once: each access through the proxy looks it up
    by_names: dict[tuple[str, ...], list[list]] = {}
    for run, names in changes:
        values = []
        for name in names:
            field = Run._meta.get_field(name)
            values.append(field.get_db_prep_save(getattr(run, field.attname), db))
        by_names.setdefault(tuple(names), []).append([*values, run.pk])
    with db.cursor() as cursor:
        for names, rows in by_names.items():
            sql = _sql(db.vendor)["update"].format(_assignments(db.vendor, names))
            if len(rows) == 1:
                cursor.execute(sql, rows[0])
            else:
                cursor.executemany(sql, rows)


def insert_events(values: list[tuple]) -> None:
    """Insert runner events, given as (run pk, sequence, runner index, created_at, row).

    Only JSON and time need preparing; the rest goes to the driver as it is.
    """
    db = connections[DEFAULT_DB_ALIAS]
    json_fields = [Event._meta.get_field(name) for name in _EVENT_JSON]
    created = Event._meta.get_field("created_at")
    rows = []
    stamps = {}
    for run_pk, sequence, runner_index, now, row in values:
        stamp = stamps.get(now)
        if stamp is None:
            stamp = stamps[now] = created.get_db_prep_save(now, db)
        rows.append(
            (
                run_pk,
                sequence,
                runner_index,
                stamp,
                row["kind"],
                row["text"],
                row["tool_name"],
                row["tool_call_id"],
                *[
                    None if row[field.name] is None else field.get_db_prep_save(row[field.name], db)
                    for field in json_fields
                ],
                row["success"],
                row["error"],
                row["truncated"],
                "",
            )
        )
    db.ensure_connection()
    driver = db.connection
    target = _sql(db.vendor)["events"]
    # The driver directly, inside Django's transaction, with Django's error classes.
    with db.wrap_database_errors:
        if db.vendor == "postgresql":
            with driver.cursor() as cursor:
                with cursor.copy(f"COPY {target} FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
            return
        # One multi-row INSERT per chunk rather than executemany: sqlite3 lets go of the GIL
        # around every statement it steps, and a frame's hundred hand-offs to the socket
        # thread cost more than the inserts themselves.
        per_chunk = driver.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(EVENT_COLUMNS)
        for start in range(0, len(rows), per_chunk):
            chunk = rows[start : start + per_chunk]
            driver.execute(
                _sqlite_insert_sql(target, len(chunk)), [value for row in chunk for value in row]
            )


@cache
def _sqlite_insert_sql(target: str, count: int) -> str:
    row = "(" + ", ".join("?" * len(EVENT_COLUMNS)) + ")"
    return f"INSERT INTO {target} VALUES " + ", ".join([row] * count)

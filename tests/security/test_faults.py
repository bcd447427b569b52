"""Issue 15 finding 15: a transient database error neither fails a run nor loses its tail.

A real daphne on PostgreSQL runs a command-engine agent that prints many lines while the
test terminates the server's database backends (``pg_terminate_backend``, found by their
``application_name``) again and again. The server retries idempotent work once on a fresh
connection and marks what still fails retryable; the SDK resends it with backoff. Every line
must be stored once, in order, and the run must end ``succeeded``.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from asgiref.sync import sync_to_async

from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from tests.support import live_server
from tests.support.fault_tools import PgFaults
from tests.support.tcp_clients import assert_gap_free, make_runner, run_row, stored_events

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # pg_terminate_backend needs PostgreSQL; skipped (and reported) on the SQLite pass only.
    pytest.mark.postgres,
]

LINES = 3000
AGENT = (
    "import sys, time\n"
    f"for i in range({LINES}):\n"
    "    print(f'line {i}', flush=True)\n"
    "    if i % 50 == 0:\n"
    "        time.sleep(0.02)\n"
)


async def test_it_stores_every_event_and_succeeds_while_database_backends_are_killed(
    daphne_factory, tmp_path
):
    name = "canopy-retry-server"
    url = live_server.database_url()
    server = daphne_factory(
        DATABASE_URL=url + ("&" if "?" in url else "?") + f"application_name={name}",
        CONN_MAX_AGE=60,  # persistent connections, the kind a terminated backend leaves stale
    )
    token = await sync_to_async(make_runner)("retry-runner")
    engine = CommandEngine([CommandPreset("counter", [sys.executable, "-c", AGENT])], str(tmp_path))
    faults = await asyncio.to_thread(PgFaults, name)
    killed = 0
    try:
        options = {"backoff_initial": 0.05, "backoff_max": 0.5, "call_timeout": 60}
        async with RunnerHost(server.ws_url, token, engine, client_options=options) as host:
            root = await host.open_root("count", profile="counter")
            task = asyncio.ensure_future(host.wait(root.run_id, timeout=120))
            while not task.done():
                killed += await asyncio.to_thread(faults.terminate_server_backends)
                await asyncio.sleep(0.15)
            await task
    finally:
        await asyncio.to_thread(faults.close)

    assert killed >= 5, f"only {killed} backends were terminated: the fault never happened"
    events = await sync_to_async(stored_events)(root.run_id)
    assert_gap_free(events, root.run_id)
    lines = [e["text"] for e in events if (e["text"] or "").startswith("line ")]
    assert lines == [f"line {i}" for i in range(LINES)]
    row = await sync_to_async(run_row)(root.run_id)
    assert row["status"] == "succeeded", row

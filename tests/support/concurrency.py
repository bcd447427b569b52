"""Parallel writers for the concurrency tests: service calls in threads released together,
each on its own database connection, as the runner socket makes them."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from delegation.errors import RpcError
from delegation.runner_socket import methods
from delegation.services import runners, tokens
from tests.support.rpc import DEFAULT_EXTENSION

# Truly parallel writers with row locks: SQLite serialises all writes on one file lock, so
# these run on PostgreSQL only (DATABASE_URL, as in .ci/run's second pass).
parallel_writers = pytest.mark.postgres


def service_connection(name="runner-c") -> runners.Connection:
    runner, _token = tokens.create_runner(name)
    conn = runners.Connection(runner_pk=runner.pk, channel_name=f"test.{name}")
    _result, generation, _fenced = methods.register(
        conn, {"hostInstanceId": "host-1", "extensions": [DEFAULT_EXTENSION]}
    )
    return runners.Connection(
        runner_pk=runner.pk, generation=generation, channel_name=f"test.{name}"
    )


def start_params(run_id="root", request_id="req-1", lease=None, **req) -> dict:
    request = {"requestId": request_id, "profile": "worker", "message": "go", **req}
    params = {"runId": run_id, "extensionId": "ext", "generation": 1, "request": request}
    if lease is not None:
        params["leaseId"] = lease
        request["leaseId"] = lease
    return params


def on_child(child: dict, run_id="root", **fields) -> dict:
    return {
        "runId": run_id,
        "extensionId": "ext",
        "generation": 1,
        "childId": child["conversationId"],
        **fields,
    }


def in_threads(n: int, work, timeout: float = 120) -> list[tuple]:
    """Run ``work(i)`` in ``n`` threads released together; ("ok", value) or ("rpc", code)."""
    barrier = threading.Barrier(n)
    results: list[tuple] = [("missing",)] * n

    def worker(i):
        try:
            barrier.wait(timeout=30)
            results[i] = ("ok", work(i))
        except RpcError as exc:
            results[i] = ("rpc", exc.code)
        except Exception as exc:  # reported, so the assertion shows what went wrong
            results[i] = ("exception", repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a writer thread hung"
    return results

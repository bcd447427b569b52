"""The suite's hooks: backends a test needs, no skips in CI, the PostgreSQL test database.

Fixtures live in ``tests/support/`` and are registered for every test below
(``pytest_plugins``); a folder's own fixtures are in its ``conftest.py``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import hypothesis
import pytest
from django.conf import settings

# Modules first, then those that import them: a plugin imported before it is registered
# would miss pytest's assertion rewriting.
pytest_plugins = [
    "tests.support.live_server",
    "tests.support.personas",
    "tests.support.fixtures",
    "tests.support.api",
    "tests.support.sso",
]

# Runners keep agents' transcripts under XDG_STATE_HOME (SPEC §14, fork from here): the
# suite's go to a directory of its own, not into the home of whoever runs it.
_STATE = tempfile.mkdtemp(prefix="canopy-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE
atexit.register(shutil.rmtree, _STATE, ignore_errors=True)

# `.ci/run` sets this: a skipped test is a test that did not run, so in CI it fails, except a
# test marked ``postgres`` on a pass without the backends it names (the SQLite pass).
NO_SKIPS = "CANOPY_NO_SKIPS"


def on_postgres() -> bool:
    return settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def missing_backends(item) -> str | None:
    """Why ``item`` cannot run here, if it is marked ``postgres`` and a backend is missing."""
    marker = item.get_closest_marker("postgres")
    if marker is None:
        return None
    if not on_postgres():
        return "needs PostgreSQL: set DATABASE_URL=postgres://... (.ci/run's second pass does)"
    if marker.kwargs.get("redis") and not settings.REDIS_URL:
        return "needs PostgreSQL and Redis: set REDIS_URL too (.ci/run's second pass does)"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = missing_backends(item)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def _skip_forbidden(report, item=None) -> bool:
    if not os.environ.get(NO_SKIPS) or not report.skipped or hasattr(report, "wasxfail"):
        return False
    return item is None or missing_backends(item) is None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _skip_forbidden(report, item):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under {NO_SKIPS} (every test must run here): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # A module skipped as a whole (importorskip, allow_module_level) is caught here.
    outcome = yield
    report = outcome.get_result()
    if _skip_forbidden(report):
        report.outcome = "failed"
        report.longrepr = f"module skipped under {NO_SKIPS}: {report.longrepr}"


@pytest.fixture(scope="session", autouse=True)
def _drop_leftover_sessions(request, django_db_blocker):
    """Before the PostgreSQL test database is dropped, end every other session on it: one
    left open (a test thread's connection, a server killed mid-request) would keep it from
    being dropped, and with a per-process name nothing would ever drop it."""
    if not on_postgres():
        yield
        return
    request.getfixturevalue("django_db_setup")  # torn down after this fixture
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(autouse=True)
def _no_name_lookups_off_the_machine(monkeypatch):
    """Webhook targets are resolved when saved and before every send. In the suite no name
    leaves the machine: IP literals and localhost resolve for real, any other name does not
    resolve (a test that needs one patches ``targets.resolve_host`` itself)."""
    from delegation.services.webhooks import targets

    monkeypatch.setattr(targets, "resolve_host", local_names_only(targets.resolve_host))


@pytest.fixture(autouse=True)
def _channels_closes_old_connections():
    """Every test starts with channels' own ``database_sync_to_async`` cleanup. channels'
    test communicator swaps ``channels.db.close_old_connections`` for a no-op with
    ``mock.patch`` around every ``send_input`` and ``receive_output``. Waits on several
    communicators at once (``asyncio.gather``) leave those patches in an order that is not
    last-in-first-out: the last to exit restores the no-op another wait saved as the
    "original", for good. tests/operators/live/test_live.py's heartbeat-spread test does that
    (the probe after it saw the no-op); every later test's database calls then kept their
    connections unchecked and unclosed, and CI's PostgreSQL pass failed
    tests/ops/test_database_threads.py."""
    import channels.db
    from django.db import close_old_connections

    channels.db.close_old_connections = close_old_connections
    yield
    channels.db.close_old_connections = close_old_connections


def local_names_only(resolve):
    import ipaddress
    import socket

    def resolve_locally(host: str, port: int) -> list[str]:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if host != "localhost":
                raise socket.gaierror(
                    socket.EAI_NONAME, f"{host}: not looked up in tests"
                ) from None
        return resolve(host, port)

    return resolve_locally


# Hypothesis: "dev" (the default) explores fresh examples each run; "ci" (HYPOTHESIS_PROFILE=ci,
# set by .ci/run) is derandomised, so a CI failure reproduces on any machine, and prints the
# blob that replays the failing example (@reproduce_failure).
hypothesis.settings.register_profile("dev", print_blob=True)
hypothesis.settings.register_profile("ci", derandomize=True, print_blob=True, database=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_configure(config):
    # The markers (own_server, postgres, soak) are registered in pyproject.toml.
    # The in-process sweep would race the tests' own explicit sweeps and DB teardown.
    settings.UPKEEP_IN_PROCESS = False
    if on_postgres():
        # The process id in the name: two runs on one server (CI, several checkouts) never
        # create, use or drop each other's test database.
        test = settings.DATABASES["default"].setdefault("TEST", {})
        test["NAME"] = f"{test.get('NAME') or 'canopy_test'}_{os.getpid()}"
    # Persistent connections held by async-to-sync worker threads would block dropping the
    # PostgreSQL test database at the end of the session.
    settings.DATABASES["default"]["CONN_MAX_AGE"] = 0

"""A real daphne server process on a free port, against the test database.

Import the fixtures into a test module (``from tests.support.live_server import daphne_server``) and
mark the tests ``@pytest.mark.django_db(transaction=True)``: the server is another process, so
it only sees committed rows.

The subprocess uses the database pytest-django created: for SQLite the test file (with the same
WAL / busy-timeout / IMMEDIATE options the settings use, passed in the URL), for PostgreSQL the
test database name on the same server. ``REDIS_URL`` passes through, so with it set the suite
exercises the Redis channel layer too.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from django.conf import settings

from canopy.serving import ServerDidNotStart, free_port, start_server, stop_server

__all__ = ["DaphneServer", "daphne_factory", "daphne_server", "free_port"]

SQLITE_OPTIONS = "timeout=20&transaction_mode=IMMEDIATE&init_command=" + quote(
    "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL;PRAGMA busy_timeout=20000;", safe=""
)


def database_url() -> str:
    """A DATABASE_URL for the test database pytest-django set up in this process."""
    db = settings.DATABASES["default"]
    engine = db["ENGINE"]
    if engine == "django.db.backends.sqlite3":
        name = str(db["NAME"])
        if name in (":memory:", "") or name.startswith("file:memorydb"):
            raise RuntimeError("a live server cannot share an in-memory SQLite database")
        return f"sqlite:///{os.path.abspath(name)}?{SQLITE_OPTIONS}"
    if engine == "django.db.backends.postgresql":
        original = os.environ.get("DATABASE_URL", "")
        parts = urlsplit(original)
        return urlunsplit(parts._replace(path="/" + quote(db["NAME"])))
    raise RuntimeError(f"no live-server support for {engine}")


class DaphneServer:
    """One daphne process; stop/start/restart keep the port so clients can reconnect.

    The first start binds port 0 and learns the port daphne got; a restart binds that port
    again (it was this server's a moment ago)."""

    def __init__(self, env: dict[str, str] | None = None, port: int | None = None):
        self.port = port or 0
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen | None = None
        self.log_file = tempfile.NamedTemporaryFile(
            prefix="canopy-daphne-", suffix=".log", delete=False
        )
        self.starts = 0

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/runner/"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["DATABASE_URL"] = database_url()
        env["DJANGO_SETTINGS_MODULE"] = "canopy.settings"
        env.setdefault("RUNNER_GRACE_SECONDS", "30")
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 30.0) -> DaphneServer:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.starts += 1
        try:
            self.process = start_server(
                "127.0.0.1",
                self.port,
                env=self.env(),
                output=self.log_file,
                own_session=True,
                timeout=timeout,
            )
        except ServerDidNotStart as failure:
            raise RuntimeError(f"{failure}:\n{self.log()}") from None
        self.port = self.process.port
        return self

    def stop(self, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop the server: SIGKILL (a crash) with ``kill``, else SIGTERM (a clean stop)."""
        stop_server(self.process, kill=kill, grace=timeout)

    def restart(self, kill: bool = False, pause: float = 0.0) -> DaphneServer:
        self.stop(kill=kill)
        if pause:
            time.sleep(pause)
        return self.start()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self, since: int = 0) -> str:
        """The server's output (from byte ``since``), at most its last 20,000 characters."""
        self.log_file.flush()
        with open(self.log_file.name, "rb") as log:
            log.seek(since)
            return log.read().decode(errors="replace")[-20000:]

    def log_size(self) -> int:
        self.log_file.flush()
        return Path(self.log_file.name).stat().st_size

    def close(self) -> None:
        self.stop()
        self.log_file.close()
        with_path = Path(self.log_file.name)
        if with_path.exists():
            with_path.unlink()


@pytest.fixture
def daphne_factory(transactional_db):
    """``start(**env)`` → a running :class:`DaphneServer`; all are stopped after the test."""
    servers: list[DaphneServer] = []

    def start(**env) -> DaphneServer:
        server = DaphneServer({k: str(v) for k, v in env.items()})
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        # Shown by pytest only when the test failed: what the server said.
        print(f"--- daphne log (port {server.port}) ---\n{server.log()}")
        server.close()


@pytest.fixture(scope="module")
def _module_daphne(request, django_db_setup, django_db_blocker):
    """One server for a whole module: starting and stopping one costs more than most of the
    tests that use it. Its settings are the defaults plus the module's ``DAPHNE_ENV`` (a
    dict), if it has one. Started before any test's monkeypatch, so no test's environment
    leaks into it."""
    env = getattr(request.module, "DAPHNE_ENV", {})
    server = DaphneServer({k: str(v) for k, v in env.items()})
    server.start()
    yield server
    server.close()


@pytest.fixture
def daphne_server(_module_daphne, transactional_db):
    """A running server with the default settings, shared by the module's tests: never
    restart or reconfigure it (use ``daphne_factory`` for a server of the test's own)."""
    server = _module_daphne
    assert server.running, f"the module's daphne has stopped:\n{server.log()}"
    mark = server.log_size()
    starts = server.starts
    yield server
    assert server.starts == starts, "a test restarted the shared server: use daphne_factory"
    # Shown by pytest only when the test failed: what the server said during it.
    print(f"--- daphne log (port {server.port}) ---\n{server.log(mark)}")

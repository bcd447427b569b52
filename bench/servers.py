"""Server processes and databases for the benchmark: nothing here touches the dev database."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from canopy.serving import ServerDidNotStart, free_port, start_server, stop_server

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
PG_ADMIN_URL = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
# The settings refuse to start on the development key; every process the bench starts
# inherits this one.
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
# Measured as deployed: with Redis, processes share a channel-layer key (check --deploy warns
# without one). It is also what lets a process push the events a doorbell from another
# process carries without reading them back (issue 39: 4 processes x 200 watchers, push p99
# 65-90 -> 55-63 ms on a 2-core EPYC).
os.environ.setdefault("CHANNEL_LAYER_KEY", secrets.token_urlsafe(40))


class Database:
    """A fresh database for one measurement: a temporary SQLite file or a PostgreSQL DB."""

    def __init__(self, kind: str):
        self.kind = kind
        self.tmp = tempfile.mkdtemp(prefix="canopy-bench-")
        if kind == "sqlite":
            self.url = f"sqlite:///{self.tmp}/bench.sqlite3"
        else:
            self.name = f"canopy_bench_{os.getpid()}"
            self._psql(f"DROP DATABASE IF EXISTS {self.name}")
            self._psql(f"CREATE DATABASE {self.name}")
            self.url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{self.name}"
        self.manage("migrate", "--noinput", "-v0")

    def _psql(self, sql: str):
        subprocess.run(
            ["psql", PG_ADMIN_URL, "-q", "-c", sql], check=True, capture_output=True, text=True
        )

    def env(self, **extra) -> dict:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.url,
            CANOPY_DATA_DIR=self.tmp,
            LOG_LEVEL="ERROR",
            PYTHONPATH=str(ROOT),
        )
        env.pop("REDIS_URL", None)
        env.update(extra)
        return env

    def manage(self, *args: str, **env) -> str:
        done = subprocess.run(
            [PYTHON, "manage.py", *args],
            cwd=ROOT,
            env=self.env(**env),
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout

    def python(self, module: str, *args: str, **env) -> str:
        done = subprocess.run(
            [PYTHON, "-m", module, *args],
            cwd=ROOT,
            env=self.env(**env),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{module} {args} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def runner_token(self, name: str) -> str:
        return self.manage("runner_token", "create", name).strip().splitlines()[-1]

    def close(self):
        if self.kind == "postgres":
            with contextlib.suppress(Exception):
                self._psql(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(self.tmp, ignore_errors=True)


class Server:
    """One daphne process serving Canopy on a free port."""

    def __init__(self, db: Database, **env):
        self.port = free_port()
        self.log = open(Path(db.tmp) / f"daphne-{self.port}.log", "w")  # noqa: SIM115
        try:
            self.proc = start_server("127.0.0.1", self.port, env=db.env(**env), output=self.log)
        except ServerDidNotStart as failure:
            raise RuntimeError(f"{failure}; see {self.log.name}") from None

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self):
        stop_server(self.proc)
        self.log.close()

"""Faults for the scale-out and fault tests: real sockets and processes, every wait bounded.

- :class:`TcpProxy`: a TCP forwarder in a thread of its own, in front of one server port,
  that can switch to another port, refuse connections and drop the ones it carries (a runner
  "away", a failover to another process).
- :class:`RedisServer`: a private ``redis-server`` on a spare port, to restart or kill
  (never the machine's shared one).
- :class:`PgFaults`: a row lock that holds a server's request in flight, and PostgreSQL's
  backend killer (``pg_terminate_backend``) for a server's connections.
- :data:`DOOMED_RUNNER`: a runner in a process of its own, to be killed.
- :func:`rss_mb`: a process's resident memory.

The clients that watch what a fault does are in ``tests.support.tcp_clients``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from django.conf import settings

from tests.support.live_server import free_port

# --- a TCP proxy -----------------------------------------------------------------------------


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target`` port, from a thread with its own event loop.

    ``switch(port)`` sends new connections elsewhere; ``refuse()`` closes new connections at
    once (the client sees its handshake fail, as with a server that is down) and ``drop()``
    aborts every open one without a close frame. ``accept()`` undoes ``refuse()``.
    """

    def __init__(self, target: int):
        self.target = target
        self.port = 0  # bound by start(): the kernel's choice, no race with other processes
        self.refusing = False
        self.accepted = 0
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None

    def ws_url(self, path: str = "/ws/runner/") -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def start(self) -> TcpProxy:
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def _run(self, coroutine, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.target), 5
            )
        except (OSError, TimeoutError):
            writer.transport.abort()
            return
        self.accepted += 1
        pair = (writer, up_writer)
        self._pairs.add(pair)

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter):
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                # One side gone: the other goes too, abruptly (no FIN-then-wait games).
                writer.transport.abort()
                up_writer.transport.abort()

        try:
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        finally:
            self._pairs.discard(pair)

    def switch(self, target: int) -> None:
        self.target = target

    def refuse(self) -> None:
        self.refusing = True

    def accept(self) -> None:
        self.refusing = False

    def drop(self) -> None:
        async def abort_all():
            for client, upstream in list(self._pairs):
                client.transport.abort()
                upstream.transport.abort()

        self._run(abort_all())

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self.drop()

        async def shutdown():
            if self._server is not None:
                self._server.close()

        with contextlib.suppress(Exception):
            self._run(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


# --- a private Redis ---------------------------------------------------------------------------


class RedisServer:
    """``redis-server`` on a spare port, no persistence: a restart loses every key."""

    def __init__(self):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.binary = binary
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.log_file = tempfile.NamedTemporaryFile(
            prefix="canopy-redis-", suffix=".log", delete=False
        )

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10) -> RedisServer:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log()}")
            if self.ping():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on {self.port}: {self.log()}")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def config_set(self, name: str, value: str) -> None:
        import redis

        client = redis.Redis(port=self.port, socket_timeout=5)
        try:
            client.config_set(name, value)
        finally:
            client.close()

    def stop(self, kill: bool = True) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def log(self) -> str:
        self.log_file.flush()
        return Path(self.log_file.name).read_text(errors="replace")[-4000:]

    def close(self) -> None:
        self.stop()
        self.log_file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log_file.name)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


# --- a runner that records the server's commands ----------------------------------------------


# --- a runner in a process of its own, to be killed --------------------------------------------

DOOMED_RUNNER = """
import asyncio, sys
from delegation.client import Extension, Preset, RunnerClient, event

async def main(url, token):
    client = RunnerClient(url, token, extensions=[Extension("ext", 1, [Preset("worker")])],
                          host_instance_id="doomed-host", depth=None)

    @client.on("child.execute")
    async def execute(params, client):
        return {}

    async with client:
        await client.open_run("conv-doomed", "doomed-root")
        await client.emit("doomed-root", event("text", "working"))
        leased = await client.child_start(
            "doomed-root", "ext", 1,
            {"requestId": "k1", "profile": "worker", "message": "go", "leaseId": "doomed-lease"},
            lease_id="doomed-lease")
        foreground = await client.child_start(
            "doomed-root", "ext", 1, {"requestId": "k2", "profile": "worker", "message": "go"})
        await client.emit(leased.run_id, event("text", "child working"))
        print("READY", leased.run_id, foreground.run_id, flush=True)
        await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def pg_dsn(autocommit: bool = True) -> dict:
    db = settings.DATABASES["default"]
    return {
        "host": db["HOST"] or "127.0.0.1",
        "port": db["PORT"] or 5432,
        "user": db["USER"],
        "password": db["PASSWORD"] or None,
        "dbname": db["NAME"],
        "autocommit": autocommit,
    }


class PgFaults:
    """A row lock to hold a server request in flight, and the backend killer."""

    def __init__(self, application_name: str):
        import psycopg

        self.application_name = application_name
        self.admin = psycopg.connect(**pg_dsn())
        self.locker = psycopg.connect(**pg_dsn(autocommit=False))

    def lock_run(self, run_id: str) -> None:
        self.locker.execute("SELECT 1 FROM delegation_run WHERE run_id = %s FOR UPDATE", [run_id])

    def unlock(self) -> None:
        self.locker.rollback()

    def waiting_on_lock(self) -> bool:
        return bool(
            self.admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = %s AND wait_event_type = 'Lock'",
                [self.application_name],
            ).fetchone()[0]
        )

    def terminate_server_backends(self) -> int:
        rows = self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s "
            "AND pid <> pg_backend_pid()",
            [self.application_name],
        ).fetchall()
        return len(rows)

    def close(self) -> None:
        self.locker.close()
        self.admin.close()

"""Tools for the scale-out and fault tests: real sockets and processes, every wait bounded.

- :class:`TcpProxy`: a TCP forwarder in a thread of its own, in front of one server port,
  that can switch to another port, refuse connections and drop the ones it carries (a runner
  "away", a failover to another process).
- :class:`RedisServer`: a private ``redis-server`` on a spare port, to restart or kill
  (never the machine's shared one).
- :class:`LiveClient`: an operator on ``/ws/live/`` with an API token, collecting frames.
- :class:`RawWebSocket`: a minimal WebSocket client on a plain socket with a tiny receive
  buffer, that can stop reading altogether (a stalled client) and resume later.
- :func:`api`: a REST call with a bearer token and a timeout.
- :func:`rss_mb`: a process's resident memory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from websockets.asyncio.client import connect

from tests.live_server import free_port

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


# --- REST -------------------------------------------------------------------------------------


def api(
    base_url: str, method: str, path: str, token: str, body=None, timeout: float = 15
) -> tuple[int, dict]:
    """One REST call; returns (status, JSON body). Raises TimeoutError if nothing comes back."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base_url + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"raw": raw.decode(errors="replace")}
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise TimeoutError(f"{method} {path}: no answer within {timeout}s") from exc
        raise
    except TimeoutError as exc:
        raise TimeoutError(f"{method} {path}: no answer within {timeout}s") from exc


# --- the operator live socket -------------------------------------------------------------------


class LiveClient:
    """``/ws/live/`` with ``Authorization: Bearer``; a reader task records every frame.

    With ``reconnect`` it behaves as the live protocol tells a client to: when the socket
    dies it connects again and resubscribes every run with ``after`` = the last sequence it
    holds (``reconnects`` and ``close_codes`` say what happened). Without it, a closed socket
    stays closed (``closed_code``).
    """

    def __init__(self, ws_url: str, token: str, reconnect: bool = False):
        self.url = ws_url
        self.token = token
        self.reconnect = reconnect
        self.frames: list[dict] = []
        self.received_at: list[float] = []  # monotonic arrival time of each frame
        self.closed_code: int | None = None
        self.close_codes: list[int | None] = []
        self.reconnects = 0
        self.subscriptions: list[str] = []
        self.closed = asyncio.Event()
        self.changed = asyncio.Event()
        self.ws = None
        self._closing = False
        self._reader: asyncio.Task | None = None

    async def _open(self, timeout: float):
        return await asyncio.wait_for(
            connect(
                self.url,
                additional_headers={"Authorization": f"Bearer {self.token}"},
                max_size=None,
                open_timeout=timeout,
            ),
            timeout,
        )

    async def connect(self, timeout: float = 10) -> LiveClient:
        self.ws = await self._open(timeout)
        self._reader = asyncio.create_task(self._read())
        await self.wait_for(lambda f: f["type"] == "hello", timeout)
        return self

    async def _read(self):
        while True:
            ws = self.ws
            try:
                async for raw in ws:
                    self.frames.append(json.loads(raw))
                    self.received_at.append(time.monotonic())
                    self.changed.set()
            except Exception:
                pass
            self.close_codes.append(ws.close_code)
            if not self.reconnect or self._closing:
                break
            if not await self._reconnect():
                break
        self.closed_code = self.ws.close_code
        self.closed.set()
        self.changed.set()

    async def _reconnect(self, attempts: int = 100) -> bool:
        for _ in range(attempts):
            await asyncio.sleep(0.1)
            try:
                self.ws = await self._open(2)
            except Exception:
                continue
            self.reconnects += 1
            for run_id in self.subscriptions:
                await self.ws.send(
                    json.dumps(
                        {"type": "subscribe", "runId": run_id, "after": self.last_sequence(run_id)}
                    )
                )
            return True
        return False

    async def send(self, frame: dict) -> None:
        await self.ws.send(json.dumps(frame))

    async def subscribe(self, run_id: str, after: int = 0) -> None:
        if run_id not in self.subscriptions:
            self.subscriptions.append(run_id)
        await self.send({"type": "subscribe", "runId": run_id, "after": after})
        await self.wait_for(lambda f: f["type"] == "subscribed" and f.get("runId") == run_id, 10)

    async def wait_for(self, predicate: Callable[[dict], bool], timeout: float) -> dict:
        """The first frame (seen so far or arriving) matching ``predicate``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for frame in self.frames:
                if predicate(frame):
                    return frame
            if self.closed.is_set():
                raise AssertionError(f"live socket closed ({self.closed_code}) while waiting")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no matching live frame in {timeout}s; last: {self.tail()}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)

    async def wait_until(self, condition: Callable[[], bool], timeout: float, what: str = ""):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not condition():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"live: {what} not reached in {timeout}s; last: {self.tail()}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 0.5))

    def events(self, run_id: str) -> list[dict]:
        out = []
        for frame in self.frames:
            if frame["type"] == "events" and frame["runId"] == run_id:
                out.extend(frame["events"])
        return out

    def sequences(self, run_id: str) -> list[int]:
        return [e["sequence"] for e in self.events(run_id)]

    def last_sequence(self, run_id: str) -> int:
        sequences = self.sequences(run_id)
        return sequences[-1] if sequences else 0

    def tail(self, count: int = 4) -> str:
        return json.dumps(self.frames[-count:])[-1500:]

    def event_times(self, run_id: str) -> dict[int, float]:
        """sequence -> when the frame carrying it arrived (monotonic)."""
        times = {}
        for frame, at in zip(self.frames, self.received_at, strict=True):
            if frame["type"] == "events" and frame["runId"] == run_id:
                for item in frame["events"]:
                    times.setdefault(item["sequence"], at)
        return times

    async def close(self) -> None:
        self._closing = True
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(), 5)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


# --- a WebSocket client that can stop reading --------------------------------------------------


class RawWebSocket:
    """A client WebSocket on a plain blocking socket whose receive buffer is tiny.

    Nothing reads the socket unless the test calls :meth:`read_frame`, so a test that stops
    calling it is a client that stopped reading: the kernel buffers fill and the server is
    left with whatever it decides to do about the bytes it still wants to send.
    """

    def __init__(self, port: int, path: str, headers: dict[str, str], rcvbuf: int = 4096):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Set before connect so the window the server sees is small from the start.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ] + [f"{name}: {value}" for name, value in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise ConnectionError(f"handshake refused: {status!r}")
        self.close_code: int | None = None
        self.bytes_read = 0

    def _recv_exact(self, count: int, deadline: float) -> bytes:
        while len(self.buffer) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame in time")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(262144)
            if not chunk:
                raise ConnectionError("connection closed without a close frame")
            self.bytes_read += len(chunk)
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def read_frame(self, timeout: float = 10) -> dict | None:
        """The next text frame as JSON; None once a close frame arrived (``close_code``)."""
        deadline = time.monotonic() + timeout
        message = b""
        while True:
            first, second = self._recv_exact(2, deadline)
            opcode, length = first & 0x0F, second & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", self._recv_exact(2, deadline))
            elif length == 127:
                (length,) = struct.unpack("!Q", self._recv_exact(8, deadline))
            payload = self._recv_exact(length, deadline)
            if opcode == 0x8:
                self.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                return None
            if opcode == 0x9:
                self._send(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            message += payload
            if first & 0x80:
                return json.loads(message)

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        header = bytes([0x80 | opcode])
        if len(payload) < 126:
            header += bytes([0x80 | len(payload)])
        elif len(payload) < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", len(payload))
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", len(payload))
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.settimeout(10)
        self.sock.sendall(header + mask + masked)

    def send_json(self, frame: dict) -> None:
        self._send(0x1, json.dumps(frame).encode())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


# --- processes ------------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


# --- a runner that records the server's commands ----------------------------------------------

FAST = {"backoff_initial": 0.05, "backoff_max": 0.5, "call_timeout": 30, "connect_timeout": 5}


class RecordingRunner:
    """The SDK with handlers that behave like a well-mannered runner and record each command.

    ``child.execute`` is accepted (the test streams the child's events itself), ``run.steer``
    is injected, ``run.cancel`` finishes the run with ``cancelled: true`` (unless
    ``finish_on_cancel`` is off) and ``lease.revoked`` is acknowledged.
    """

    def __init__(self, url: str, token: str, *, finish_on_cancel: bool = True, **options):
        from delegation.client import Extension, Preset, RunnerClient

        self.client = RunnerClient(
            url,
            token,
            extensions=[Extension("ext", 1, [Preset("worker")])],
            host_instance_id="fault-host",
            depth=None,
            **{**FAST, **options},
        )
        self.finish_on_cancel = finish_on_cancel
        self.commands: list[tuple[float, str, dict]] = []
        self.changed = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()
        for method in ("child.execute", "run.steer", "run.cancel", "lease.revoked"):
            self.client.on(method, self._handler(method))

    def _handler(self, method: str):
        async def handle(params: dict, client):
            self.commands.append((time.monotonic(), method, params))
            self.changed.set()
            if method == "run.steer":
                return {"outcome": "injected"}
            if method == "run.cancel" and self.finish_on_cancel:
                task = asyncio.create_task(client.finish(params["runId"], cancelled=True))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            return {}

        return handle

    def received(self, method: str, **match) -> list[tuple[float, dict]]:
        return [
            (at, params)
            for at, name, params in self.commands
            if name == method and all(params.get(k) == v for k, v in match.items())
        ]

    async def wait_command(self, method: str, timeout: float, count: int = 1, **match) -> float:
        """When the ``count``-th ``method`` command whose params match arrived (monotonic)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(found := self.received(method, **match)) < count:
            remaining = deadline - loop.time()
            if remaining <= 0:
                seen = [(name, params) for _, name, params in self.commands]
                raise AssertionError(f"no {count} {method} {match} within {timeout}s; got {seen}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return found[count - 1][0]

    async def __aenter__(self) -> RecordingRunner:
        await self.client.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        for task in list(self.tasks):
            task.cancel()
        await self.client.close()


# --- the record, as the test database holds it -----------------------------------------------


def make_runner(name: str) -> str:
    from delegation.services import tokens

    return tokens.create_runner(name)[1]


def stored_events(run_id: str) -> list[dict]:
    from delegation.models import Event

    return list(
        Event.objects.filter(run__run_id=run_id)
        .order_by("sequence")
        .values("sequence", "kind", "text", "runner_index", "actor", "data")
    )


def run_row(run_id: str) -> dict:
    from delegation.models import Run

    return Run.objects.filter(run_id=run_id).values(
        "status", "done", "cancelled", "error", "last_sequence", "emitted", "cancel_requested_at"
    )[0]


def assert_gap_free(events: list[dict], what: str) -> None:
    sequences = [e["sequence"] for e in events]
    assert sequences == list(range(1, len(sequences) + 1)), (
        f"{what}: sequences are not 1..{len(sequences)} without gaps or duplicates: {sequences}"
    )


async def eventually(check: Callable[[], object], timeout: float, what: str, every=0.05):
    """Poll the sync ``check`` (in a thread: it may use the ORM) until it returns truthy."""
    from asgiref.sync import sync_to_async

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = None
    while True:
        last = await sync_to_async(check)()
        if last:
            return last
        if loop.time() >= deadline:
            raise AssertionError(f"{what}: not reached within {timeout}s")
        await asyncio.sleep(every)


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

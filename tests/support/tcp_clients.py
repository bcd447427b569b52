"""Clients of a live server over real TCP, for the scale-out and fault tests; every wait bounded.

- :func:`api`: a REST call with a bearer token and a timeout.
- :class:`LiveClient`: an operator on ``/ws/live/`` with an API token, collecting frames.
- :class:`RawWebSocket`: a minimal WebSocket client on a plain socket with a tiny receive
  buffer, that can stop reading altogether (a stalled client) and resume later.
- :class:`RecordingRunner`: the SDK's runner, recording what it sent and was sent; with
  :func:`make_runner`, :func:`stored_events`, :func:`run_row`, :func:`assert_gap_free` and
  :func:`eventually` to check what the database kept.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from websockets.asyncio.client import connect

from tests.support import runners

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


FAST = {**runners.FAST, "connect_timeout": 5}


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

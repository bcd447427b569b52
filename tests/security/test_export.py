"""Issue 15 finding 5: the NDJSON export streams with back-pressure and is bounded per user.

The back-pressure test runs a real daphne and a raw HTTP client on a plain socket that stops
reading after the headers (the kernel's buffers then hold a few MB at most): the server must hold a bounded amount,
not the export, and the client must still get every line once it reads again.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Event, Run, Runner, Session
from delegation.services import tokens
from tests.support.fault_tools import rss_mb
from tests.support.personas import api_token

LINE_TEXT = 2000
EVENTS = 25_000  # about 50 MB of NDJSON


def _seed() -> None:
    runner, _ = tokens.create_runner("export-runner")
    runner = Runner.objects.get(pk=runner.pk)
    session = Session.objects.create(conversation_id="conv-big", runner=runner, depth=0)
    run = Run.objects.create(run_id="big-run", session=session, runner=runner, depth=0)
    filler = "x" * LINE_TEXT
    Event.objects.bulk_create(
        (
            Event(run=run, sequence=i, runner_index=i, kind="text", text=f"{i} {filler}")
            for i in range(1, EVENTS + 1)
        ),
        batch_size=2000,
    )
    Run.objects.filter(pk=run.pk).update(last_sequence=EVENTS, emitted=EVENTS)


class PausedHttpClient:
    """GET on a blocking socket; nothing is read unless the test asks."""

    def __init__(self, port: int, path: str, token: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(15)
        self.sock.connect(("127.0.0.1", port))
        request = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        self.data = b""
        while b"\r\n\r\n" not in self.data:
            self.data += self.sock.recv(4096)

    def read_all(self) -> bytes:
        """Everything until the server closes or ends the chunked body."""
        try:
            while not self.data.endswith(b"\r\n0\r\n\r\n"):
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    break
                self.data += chunk
        except TimeoutError:
            raise AssertionError(
                f"the export stalled after {len(self.data)} bytes: {self.data[-200:]!r}"
            ) from None
        finally:
            self.sock.close()
        return self.data


@pytest.mark.django_db(transaction=True)
async def test_it_pauses_an_export_whose_client_stopped_reading(daphne_factory, people):
    await sync_to_async(_seed)()
    payload_mb = EVENTS * LINE_TEXT / 1e6
    token = await sync_to_async(api_token)(people["viewer"])
    server = daphne_factory()
    pid = server.process.pid
    # Warm the process up (imports, a first export) before measuring.
    warm = await asyncio.to_thread(PausedHttpClient, server.port, "/api/runs", token)
    await asyncio.to_thread(warm.read_all)
    before = rss_mb(pid)

    client = await asyncio.to_thread(
        PausedHttpClient, server.port, "/api/runs/big-run/export", token
    )
    assert b" 200 " in client.data.split(b"\r\n", 1)[0]
    peak = before
    for _ in range(30):  # three seconds of a client that reads nothing
        await asyncio.sleep(0.1)
        peak = max(peak, rss_mb(pid))
    grown = peak - before
    print(f"export of {payload_mb:.0f} MB to a paused client: server RSS +{grown:.1f} MB")

    # While two exports of this user stream (EXPORT_MAX_CONCURRENT_PER_USER=2), a third is
    # refused; another user's is not.
    second = await asyncio.to_thread(
        PausedHttpClient, server.port, "/api/runs/big-run/export", token
    )
    third = await asyncio.to_thread(
        PausedHttpClient, server.port, "/api/runs/big-run/export", token
    )
    refused = (await asyncio.to_thread(third.read_all)).decode()
    assert refused.startswith("HTTP/1.1 429"), refused[:200]
    assert "too_many_requests" in refused and "EXPORT_MAX_CONCURRENT_PER_USER" in refused
    other_token = await sync_to_async(api_token)(people["operator"])
    other = await asyncio.to_thread(
        PausedHttpClient, server.port, "/api/runs/big-run/export", other_token
    )
    assert b" 200 " in other.data.split(b"\r\n", 1)[0]
    other.sock.close()
    second.sock.close()

    started = time.monotonic()
    body = await asyncio.to_thread(client.read_all)
    lines = [line for line in body.split(b"\r\n\r\n", 1)[1].split(b"\n") if b'"runId"' in line]
    took = time.monotonic() - started
    assert len(lines) == EVENTS, f"{len(lines)} lines after resuming ({took:.1f}s)"
    assert grown < payload_mb / 4, (
        f"the server buffered the export for a client that was not reading: RSS grew "
        f"{grown:.0f} MB for a {payload_mb:.0f} MB export"
    )

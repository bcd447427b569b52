"""NDJSON export: every event round-trips, and the response streams page by page with flat
memory, under WSGI (synchronous iterator) and under ASGI (asynchronous iterator)."""

import json
import tracemalloc

import pytest
from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse
from django.test import AsyncClient

from dashboard.api import export
from delegation import selectors
from delegation.models import Event, Run
from tests.support.api import build_world, emit
from tests.support.personas import api_token

EVENTS = 30_000
FRAME = 1_000


def fill(conn, run_id: str, first: int, count: int) -> None:
    """``count`` events through run.event frames, as a chatty runner would send them."""
    pad = "x" * 300
    for start in range(first, first + count, FRAME):
        frame = []
        for index in range(start, min(start + FRAME, first + count)):
            if index % 10 == 0:
                frame.append(
                    {"kind": "tool-use", "toolName": "grep", "toolCallId": f"t{index}",
                     "input": {"pattern": f"p{index}", "n": index}}
                )  # fmt: skip
            else:
                frame.append({"kind": "text-delta", "text": f"{index} {pad} é✓"})
        emit(conn, run_id, frame, start=start)


def consume(response) -> tuple[int, int, int, int]:
    """Read a streamed export; (chunks, bytes, lines, tracemalloc peak while reading)."""
    tracemalloc.start()
    try:
        chunks = total = lines = 0
        baseline = tracemalloc.get_traced_memory()[0]
        for chunk in response.streaming_content:
            chunks += 1
            total += len(chunk)
            lines += chunk.count(b"\n")
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    return chunks, total, lines, peak


def expected_lines(run_ids) -> list[dict]:
    lines = []
    for run in Run.objects.filter(run_id__in=run_ids).order_by("pk"):
        for event in Event.objects.filter(run=run).order_by("sequence"):
            lines.append({"runId": run.run_id, **selectors.event_wire(event)})
    return lines


@pytest.mark.django_db
def test_it_exports_tens_of_thousands_of_events_streamed_with_flat_memory(as_, world):
    api = as_("viewer", "token")
    fill(world.conn, "root-1", first=5, count=EVENTS // 10)  # root-1 holds 4 already
    small = api.get("/api/runs/root-1/export")
    assert isinstance(small, StreamingHttpResponse) and small.streaming
    _, small_bytes, small_lines, small_peak = consume(small)
    assert small_lines == EVENTS // 10 + 4

    fill(world.conn, "root-1", first=5 + EVENTS // 10, count=EVENTS - EVENTS // 10)
    response = api.get("/api/runs/root-1/export")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    chunks, total, lines, peak = consume(response)
    print(
        f"\nexport of {lines} events: {total} bytes in {chunks} chunks, tracemalloc peak "
        f"{peak} bytes (export of {small_lines} events: {small_bytes} bytes, peak {small_peak})"
    )
    assert lines == EVENTS + 4
    # Pages of 1,000 events: the body arrives in 31 chunks, never in one piece.
    assert chunks == -(-(EVENTS + 4) // export.PAGE_SIZE)
    assert total > 10_000_000 and total > 9 * small_bytes
    # Flat: ten times the events, about the same peak (one page), a fraction of the body.
    assert peak < 1.5 * small_peak + 256 * 1024, (peak, small_peak)
    assert peak < total / 2

    # Round trip: every event exactly once, in order, as /events shows it.
    body = b"".join(api.get("/api/runs/root-1/export").streaming_content).decode()
    exported = [json.loads(line) for line in body.splitlines()]
    assert exported == expected_lines(["root-1"])
    assert [e["sequence"] for e in exported] == list(range(1, EVENTS + 5))


@pytest.mark.django_db
def test_it_exports_a_subtree_naming_each_run(as_, world):
    emit(world.conn, world.grandchild["runId"], ["deep"])
    api = as_("operator", "session")
    one = b"".join(api.get("/api/runs/root-1/export").streaming_content).decode()
    assert {json.loads(line)["runId"] for line in one.splitlines()} == {"root-1"}
    body = b"".join(api.get("/api/runs/root-1/export?subtree=true").streaming_content).decode()
    exported = [json.loads(line) for line in body.splitlines()]
    ids = ["root-1", world.child["runId"], world.grandchild["runId"]]
    assert exported == expected_lines(ids)
    branch = api.get(f"/api/runs/{world.child['runId']}/export", {"subtree": "true"})
    branch_lines = b"".join(branch.streaming_content).splitlines()
    branch_ids = {json.loads(line)["runId"] for line in branch_lines}
    assert branch_ids == {world.child["runId"], world.grandchild["runId"]}
    # With usage, each run's closing record names it by its task (issue 38).
    tail = api.get("/api/runs/root-1/export", {"subtree": "true", "usage": "true"})
    records = [json.loads(line) for line in b"".join(tail.streaming_content).splitlines()]
    tasks = {r["runId"]: r["task"] for r in records if r.get("record") == "usage"}
    assert tasks.pop("root-1") == "" and len(tasks) == 4  # run.open sent no message
    assert set(tasks.values()) == {"do the thing"}


@pytest.mark.django_db
def test_it_pages_exports_across_runs_and_page_boundaries(world):
    emit(world.conn, world.child["runId"], [f"c{i}" for i in range(5)], start=3)
    ids = selectors.subtree_run_ids(Run.objects.get(run_id="root-1"))
    small = b"".join(export.iter_ndjson(ids, page_size=3)).decode().splitlines()
    large = b"".join(export.iter_ndjson(ids, page_size=1000)).decode().splitlines()
    assert small == large and len(large) == 4 + 7


@pytest.mark.django_db(transaction=True)
async def test_it_streams_through_the_production_asgi_application(monkeypatch, viewer):
    """Daphne serves Django through ASGI, where a synchronous iterator would be read whole
    into a list before the first byte is sent; the export must hand it an async one. Driven
    through canopy.asgi.application: the first bytes leave before most pages are read."""
    from channels.testing import ApplicationCommunicator

    from canopy.asgi import application

    def setup():
        world = build_world()
        emit(world.conn, "root-1", [f"line {i}" for i in range(2500)], start=5)
        return api_token(viewer)

    token = await sync_to_async(setup)()
    monkeypatch.setattr(export, "PAGE_SIZE", 100)
    pages_read = []
    real_page = selectors.event_export_page

    def counting_page(*args):
        rows = real_page(*args)
        pages_read.append(len(rows))
        return rows

    monkeypatch.setattr(selectors, "event_export_page", counting_page)
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/api/runs/root-1/export",
        "raw_path": b"/api/runs/root-1/export",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    app = ApplicationCommunicator(application, scope)
    await app.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await app.receive_output(timeout=10)
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert dict(start["headers"])[b"Content-Type"] == b"application/x-ndjson"
    bodies = []
    read_at_first_body = None
    while True:
        message = await app.receive_output(timeout=10)
        bodies.append(message.get("body", b""))
        if read_at_first_body is None and message.get("body"):
            read_at_first_body = len(pages_read)
        if not message.get("more_body"):
            break
    await app.wait(timeout=10)
    # 2,504 events in pages of 100: 26 pages read, but the first bytes were on their way
    # after a couple of them (a collected iterator would have read all 26 first).
    assert len(pages_read) == 26
    assert read_at_first_body <= 3, read_at_first_body
    lines = b"".join(bodies).decode().splitlines()
    assert [json.loads(line)["sequence"] for line in lines] == list(range(1, 2505))


@pytest.mark.django_db(transaction=True)
async def test_it_hands_asgi_an_asynchronous_iterator(viewer):
    def setup():
        build_world()
        return api_token(viewer)

    token = await sync_to_async(setup)()
    response = await AsyncClient().get(
        "/api/runs/root-1/export", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200
    assert response.is_async, "a sync iterator would be collected whole under ASGI"
    chunks = [chunk async for chunk in response.streaming_content]
    assert len(b"".join(chunks).splitlines()) == 4

"""NDJSON export, streamed: one keyset page of events in memory at a time.

Django serves a ``StreamingHttpResponse`` with a *synchronous* iterator under ASGI by first
collecting the whole iterator into a list (``sync_to_async(list)``) - the whole export would
sit in memory. So the response gets an asynchronous iterator under ASGI (daphne, the
production server) and a synchronous one under WSGI (the test client, other servers); both
read the same keyset pages through ``selectors.event_export_page``.
"""

from __future__ import annotations

import json
import weakref
from collections import defaultdict

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse

from dashboard.api.core import ApiError
from delegation import selectors

PAGE_SIZE = 1000
RUNS_PER_QUERY = 500
CONTENT_TYPE = "application/x-ndjson"

_FIELDS = (
    ("text", 3),
    ("toolName", 4),
    ("toolCallId", 5),
    ("input", 6),
    ("toolOutput", 7),
    ("success", 8),
    ("error", 9),
)


def _line(run_ids: dict[int, str], row: tuple) -> str:
    record = {"runId": run_ids[row[0]], "sequence": row[1], "kind": row[2]}
    for name, index in _FIELDS:
        if row[index] is not None:
            record[name] = row[index]
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


def _chunks(run_ids: dict[int, str]):
    pks = sorted(run_ids)
    return [pks[i : i + RUNS_PER_QUERY] for i in range(0, len(pks), RUNS_PER_QUERY)]


def iter_ndjson(run_ids: dict[int, str], page_size: int = PAGE_SIZE):
    """Synchronous stream: one page of ``page_size`` events per chunk."""
    for chunk in _chunks(run_ids):
        after = (0, 0)
        while True:
            rows = selectors.event_export_page(chunk, after, page_size)
            if not rows:
                break
            yield "".join(_line(run_ids, row) for row in rows).encode("utf-8")
            if len(rows) < page_size:
                break
            after = (rows[-1][0], rows[-1][1])


async def aiter_ndjson(run_ids: dict[int, str], page_size: int = PAGE_SIZE):
    """The same stream for ASGI: each page is read in the database thread, then sent."""
    fetch = sync_to_async(selectors.event_export_page)
    for chunk in _chunks(run_ids):
        after = (0, 0)
        while True:
            rows = await fetch(chunk, after, page_size)
            if not rows:
                break
            yield "".join(_line(run_ids, row) for row in rows).encode("utf-8")
            if len(rows) < page_size:
                break
            after = (rows[-1][0], rows[-1][1])


def usage_lines(run_ids: dict[int, str]) -> bytes:
    """One line per run after the events: ``{"runId", "record": "usage", "usage", "budget"}``,
    read from the rollup and budget rows (a page of runs per query)."""
    out = []
    for chunk in _chunks(run_ids):
        for row in selectors.usage_rows(chunk):
            out.append(
                json.dumps(
                    {"runId": run_ids[row.pop("pk")], "record": "usage", **row},
                    ensure_ascii=False,
                    separators=(",", ":"),
                    default=str,
                )
                + "\n"
            )
    return "".join(out).encode("utf-8")


async def _with_tail(stream, run_ids):
    async for chunk in stream:
        yield chunk
    yield await sync_to_async(usage_lines)(run_ids)


def _with_tail_sync(stream, run_ids):
    yield from stream
    yield usage_lines(run_ids)


class _Slot:
    """One export's place; held by its stream, so a stream dropped unread frees it too."""


# Exports streaming now, per user, in this process.
_running: dict[int, weakref.WeakSet] = defaultdict(weakref.WeakSet)


def _claim(user_pk: int) -> _Slot:
    limit = settings.EXPORT_MAX_CONCURRENT_PER_USER
    slots = _running[user_pk]
    if len(slots) >= limit:
        raise ApiError(
            429,
            "too_many_requests",
            f"at most {limit} exports at once per user (EXPORT_MAX_CONCURRENT_PER_USER); "
            "wait for one to finish",
        )
    slot = _Slot()
    slots.add(slot)
    return slot


def _counted(stream, user_pk: int, slot: _Slot):
    try:
        yield from stream
    finally:
        _running[user_pk].discard(slot)


async def _acounted(stream, user_pk: int, slot: _Slot):
    # Released however the stream ends: finished, failed, or cancelled by a disconnect.
    try:
        async for chunk in stream:
            yield chunk
    finally:
        _running[user_pk].discard(slot)


def ndjson_response(
    request, run_ids: dict[int, str], filename: str, usage: bool = False
) -> StreamingHttpResponse:
    user_pk = request.auth.pk
    slot = _claim(user_pk)
    if isinstance(request, ASGIRequest):
        stream = aiter_ndjson(run_ids, PAGE_SIZE)
        if usage:
            stream = _with_tail(stream, run_ids)
        stream = _acounted(stream, user_pk, slot)
    else:
        stream = iter_ndjson(run_ids, PAGE_SIZE)
        if usage:
            stream = _with_tail_sync(stream, run_ids)
        stream = _counted(stream, user_pk, slot)
    response = StreamingHttpResponse(stream, content_type=CONTENT_TYPE)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "no-store"
    return response

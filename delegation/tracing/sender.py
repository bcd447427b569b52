"""The export step of the upkeep loop: claim due rows, build their spans, send, record.

The database work runs on the ORM's thread (``database_sync_to_async``); the OTLP request
(blocking, the SDK's ``requests`` exporter) runs on a worker thread of its own, so a slow or
down collector holds neither the event loop nor the ORM thread. A failed request leaves its
rows queued with an exponential backoff: a collector that is down delays export and loses
nothing. Ids are deterministic, so a request that reached the collector but whose success
was never recorded (a crash in between) sends the same spans again, never new ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from channels.db import database_sync_to_async
from django.conf import settings
from opentelemetry.sdk.trace.export import SpanExportResult

from delegation import metrics
from delegation.models import Run
from delegation.tracing import otlp, queue, reads, spans

log = logging.getLogger(__name__)

_exporters: dict[str, object] = {}
OPEN_RUNS_EVERY_SECONDS = 5.0


def exporter():
    """One exporter (and its HTTP connection pool) per endpoint for the process."""
    url = settings.OTEL_TRACES_URL
    if url not in _exporters:
        _exporters[url] = otlp.exporter(url)
    return _exporters[url]


@dataclass
class Batch:
    run_pks: list
    claimed_at: object
    spans: list


def take_batch(limit: int | None = None) -> Batch | None:
    run_pks, claimed_at = queue.claim(limit or settings.OTEL_EXPORT_BATCH_RUNS)
    if not run_pks:
        return None
    return Batch(run_pks, claimed_at, spans.build_spans(reads.runs_for_export(run_pks)))


def send(batch: Batch, target=None) -> bool:
    """The OTLP request of one batch (blocking; the caller picks the thread)."""
    if not batch.spans:
        return True
    try:
        result = (target or exporter()).export(batch.spans)
    except Exception as exc:  # the SDK reports by result; anything else is a failure too
        log.warning("trace export failed: %s", type(exc).__name__)
        return False
    return result == SpanExportResult.SUCCESS


def finish(batch: Batch, ok: bool) -> float:
    """Record the outcome; answers the backoff before the next attempt (0 after success)."""
    if ok:
        queue.record_sent(batch.run_pks, batch.claimed_at)
        metrics.traces_exported(len(batch.spans), "sent")
        return 0.0
    metrics.traces_exported(len(batch.spans), "failed")
    return queue.record_failed(batch.run_pks, batch.claimed_at, "OTLP export failed")


def drain(limit: int | None = None, target=None) -> tuple[int, int]:
    """Send every due row now, synchronously (the command, the tests); stops at a failure.
    Answers (spans sent, batches failed)."""
    sent = failed = 0
    while (batch := take_batch(limit)) is not None:
        ok = send(batch, target)
        finish(batch, ok)
        if not ok:
            failed += 1
            break
        sent += len(batch.spans)
    return sent, failed


def send_tree(root: Run, target=None) -> tuple[int, bool]:
    """Build and send every span of ``root``'s tree now, outside the queue."""
    pks = list(Run.objects.in_tree(root).values_list("pk", flat=True))
    total, ok = 0, True
    for start in range(0, len(pks), settings.OTEL_EXPORT_BATCH_RUNS):
        chunk = spans.build_spans(
            reads.runs_for_export(pks[start : start + settings.OTEL_EXPORT_BATCH_RUNS])
        )
        ok = send(Batch([], None, chunk), target) and ok
        total += len(chunk)
    return total, ok


async def export_forever():
    """The upkeep loop's export task: queue long-open runs, then send due batches back to
    back until the queue is empty or a request fails (then wait out the backoff)."""
    looked_at = 0.0
    while True:
        await asyncio.sleep(settings.MAINTENANCE_INTERVAL_SECONDS)
        try:
            # Long-open runs are a minutes-scale question: not every tick's query.
            if time.monotonic() - looked_at >= OPEN_RUNS_EVERY_SECONDS:
                looked_at = time.monotonic()
                await database_sync_to_async(queue.queue_open_runs)()
            while (batch := await database_sync_to_async(take_batch)()) is not None:
                ok = await asyncio.to_thread(send, batch)
                delay = await database_sync_to_async(finish)(batch, ok)
                if not ok:
                    await asyncio.sleep(min(delay, settings.OTEL_EXPORT_RETRY_MAX_SECONDS))
                    break
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("trace export step failed; retrying")

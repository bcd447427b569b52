"""Background upkeep inside each server process: lease expiry, runner loss, webhook sending.

Every process runs the sweep; each step re-checks its row under a lock, so running it in
several processes at once is safe. Deployments that prefer a separate process can run
``python manage.py upkeep`` and set ``UPKEEP_IN_PROCESS=false``.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from django.conf import settings

from delegation import webhooks
from delegation.services import retention, sweep
from delegation.tracing import sender as trace_sender

log = logging.getLogger(__name__)

_task: asyncio.Task | None = None
_sender: asyncio.Task | None = None
_tracer: asyncio.Task | None = None
_retention: asyncio.Task | None = None


def ensure_started() -> None:
    """Start the sweep loop and the webhook sender on the running event loop once (and again
    after a loop change). The sender is its own task so a slow receiver never delays a sweep."""
    global _task, _sender, _tracer, _retention
    if not settings.UPKEEP_IN_PROCESS:
        return
    loop = asyncio.get_running_loop()
    if _task is None or _task.done() or _task.get_loop() is not loop:
        _task = loop.create_task(_sweep_forever())
    if _sender is None or _sender.done() or _sender.get_loop() is not loop:
        _sender = loop.create_task(webhooks.deliver_forever())
    # Trace export (SPEC §12) only with an OTLP endpoint; its own task for the same reason.
    if settings.OTEL_EXPORT_ENABLED and (
        _tracer is None or _tracer.done() or _tracer.get_loop() is not loop
    ):
        _tracer = loop.create_task(trace_sender.export_forever())
    if _retention is None or _retention.done() or _retention.get_loop() is not loop:
        _retention = loop.create_task(retention_forever())


async def _sweep_forever():
    while True:
        await asyncio.sleep(settings.MAINTENANCE_INTERVAL_SECONDS)
        try:
            await database_sync_to_async(sweep.sweep)()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("upkeep sweep failed; retrying")


async def retention_forever():
    """Retention passes (issue 28), each batch its own short transaction on the worker thread
    and a pause between batches, so a pass never holds the database (or the thread every
    socket's queries share) for long."""
    while True:
        await asyncio.sleep(settings.RETENTION_INTERVAL_SECONDS)
        try:
            if not await database_sync_to_async(retention.pass_is_due)():
                continue
            run = await database_sync_to_async(retention.Pass)()
            # Not on the one thread every socket's queries share (thread_sensitive): a batch
            # must never make a runner's frame wait behind it in this process.
            step = database_sync_to_async(run.step, thread_sensitive=False)
            while await step():
                await asyncio.sleep(settings.RETENTION_BATCH_PAUSE_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("retention pass failed; the next one retries")

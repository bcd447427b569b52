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
from delegation.services import sweep
from delegation.tracing import sender as trace_sender

log = logging.getLogger(__name__)

_task: asyncio.Task | None = None
_sender: asyncio.Task | None = None
_tracer: asyncio.Task | None = None


def ensure_started() -> None:
    """Start the sweep loop and the webhook sender on the running event loop once (and again
    after a loop change). The sender is its own task so a slow receiver never delays a sweep."""
    global _task, _sender, _tracer
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


async def _sweep_forever():
    while True:
        await asyncio.sleep(settings.MAINTENANCE_INTERVAL_SECONDS)
        try:
            await database_sync_to_async(sweep.sweep)()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("upkeep sweep failed; retrying")

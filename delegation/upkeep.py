"""Background upkeep inside each server process: lease expiry and runner loss.

Every process runs the sweep; each step re-checks its row under a lock, so running it in
several processes at once is safe. Deployments that prefer a separate process can run
``python manage.py upkeep`` and set ``UPKEEP_IN_PROCESS=false``.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from django.conf import settings

from delegation.services import sweep

log = logging.getLogger(__name__)

_task: asyncio.Task | None = None


def ensure_started() -> None:
    """Start the sweep loop on the running event loop once (and again after a loop change)."""
    global _task
    if not settings.UPKEEP_IN_PROCESS:
        return
    loop = asyncio.get_running_loop()
    if _task is not None and not _task.done() and _task.get_loop() is loop:
        return
    _task = loop.create_task(_sweep_forever())


async def _sweep_forever():
    while True:
        await asyncio.sleep(settings.MAINTENANCE_INTERVAL_SECONDS)
        try:
            await database_sync_to_async(sweep.sweep)()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("upkeep sweep failed; retrying")

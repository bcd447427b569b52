"""Run lease expiry, runner-loss detection and webhook sending in a loop, outside the server
processes (with ``UPKEEP_IN_PROCESS=false``)."""

import asyncio

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.management.base import BaseCommand

from delegation import upkeep, webhooks
from delegation.services import sweep
from delegation.tracing import queue as trace_queue
from delegation.tracing import sender as trace_sender


class Command(BaseCommand):
    help = (
        "Expire leases, mark lost runners and send due webhook deliveries, every "
        "MAINTENANCE_INTERVAL_SECONDS; retention passes every RETENTION_INTERVAL_SECONDS."
    )

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="sweep once and exit")

    def handle(self, *args, once=False, **options):
        asyncio.run(self._loop(once))

    async def _loop(self, once: bool):
        # Retention (issue 28) on its own task, batch by batch, as the server processes run it.
        retention = None if once else asyncio.ensure_future(upkeep.retention_forever())
        try:
            await self._sweep(once)
        finally:
            if retention is not None:
                retention.cancel()

    async def _sweep(self, once: bool):
        async with webhooks.make_client() as client:
            # Each delivery on its own task: a hanging receiver does not hold up the sweep.
            sender = webhooks.Sender(client)
            while True:
                report = await database_sync_to_async(sweep.sweep)()
                if report.expired_leases or report.lost_runners:
                    self.stdout.write(
                        f"expired leases: {report.expired_leases}; "
                        f"lost runners: {report.lost_runners}"
                    )
                await sender.sweep()
                if once:
                    await sender.wait()
                if sender.outcomes:
                    self.stdout.write(f"webhook deliveries: {sender.outcomes}")
                    sender.outcomes.clear()
                if settings.OTEL_EXPORT_ENABLED:
                    # Trace export (SPEC §12) on a worker thread: a down collector holds
                    # this loop for at most one request's timeout.
                    await database_sync_to_async(trace_queue.queue_open_runs)()
                    sent, failed = await asyncio.to_thread(_drain_traces)
                    if sent or failed:
                        self.stdout.write(f"trace spans sent: {sent}; failed batches: {failed}")
                if once:
                    return
                await asyncio.sleep(settings.MAINTENANCE_INTERVAL_SECONDS)


def _drain_traces():
    from django.db import close_old_connections

    try:
        return trace_sender.drain()
    finally:
        close_old_connections()

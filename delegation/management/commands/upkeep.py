"""Run lease expiry and runner-loss detection in a loop, outside the server processes."""

import time

from django.conf import settings
from django.core.management.base import BaseCommand

from delegation.services import sweep


class Command(BaseCommand):
    help = "Expire leases and mark lost runners, every MAINTENANCE_INTERVAL_SECONDS."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="sweep once and exit")

    def handle(self, *args, once=False, **options):
        while True:
            report = sweep.sweep()
            if report.expired_leases or report.lost_runners:
                self.stdout.write(
                    f"expired leases: {report.expired_leases}; lost runners: {report.lost_runners}"
                )
            if once:
                return
            time.sleep(settings.MAINTENANCE_INTERVAL_SECONDS)

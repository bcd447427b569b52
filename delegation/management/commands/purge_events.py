"""Retention by age (SPEC §5, issue 28): one retention pass now, as the upkeep loop runs it."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from delegation.services.retention import do_retention_pass


class Command(BaseCommand):
    help = (
        "Run one retention pass now: transcripts of runs finished more than EVENT_RETENTION_DAYS"
        " (or --days) ago, and trees and audit entries past RUN_/AUDIT_RETENTION_DAYS."
    )

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=None, help="events: overrides the setting")

    def handle(self, *args, days=None, **options):
        if days is not None:
            if days <= 0:
                raise CommandError("--days must be at least 1")
        elif not (
            settings.EVENT_RETENTION_DAYS
            or settings.RUN_RETENTION_DAYS
            or settings.AUDIT_RETENTION_DAYS
        ):
            raise CommandError(
                "retention is off (EVENT_RETENTION_DAYS=0, RUN_RETENTION_DAYS=0 and "
                "AUDIT_RETENTION_DAYS=0); pass --days N"
            )
        done = do_retention_pass(event_days=days)
        self.stdout.write(
            f"deleted {done.events_deleted} events, {done.runs_deleted} runs "
            f"({done.trees_deleted} trees) and {done.audit_deleted} audit entries "
            f"in {done.batches} batches"
        )

"""Retention by age (SPEC §5): drop the events of runs that finished long ago."""

from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from delegation.models import Event


class Command(BaseCommand):
    help = "Delete events of runs finished more than EVENT_RETENTION_DAYS (or --days) ago."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=None)

    def handle(self, *args, days=None, **options):
        days = settings.EVENT_RETENTION_DAYS if days is None else days
        if days <= 0:
            raise CommandError("retention is off (EVENT_RETENTION_DAYS=0); pass --days N")
        cutoff = timezone.now() - timedelta(days=days)
        # Only finished runs: a live run's stream must stay gap-free for its readers.
        deleted, _ = Event.objects.filter(
            run__finished_at__isnull=False, run__finished_at__lt=cutoff
        ).delete()
        self.stdout.write(f"deleted {deleted} events of runs finished before {cutoff:%Y-%m-%d}")

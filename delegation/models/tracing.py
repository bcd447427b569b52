"""The trace export queue (SPEC §12): one row per run whose spans are due at the collector."""

from django.db import models
from django.utils import timezone

from delegation.models.runs import Run


class TraceExport(models.Model):
    """A run's spans, queued for export when it ends (or while it stays open too long).

    The spans themselves are built from the record when they are sent, so a row is a few
    bytes on the finish path. ``queued_at`` is the row's version: the sender marks a row sent
    only if it was not queued again while the request was in flight (a run that ended while
    its open-run spans were being sent), so the final spans are never skipped.
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="trace_export")
    # False while the run is still open: its spans so far; set again at its end.
    final = models.BooleanField(default=False)
    sent = models.BooleanField(default=False)
    queued_at = models.DateTimeField(default=timezone.now)
    # Due now or after a failure's backoff; a claim pushes it ahead so one sender owns it.
    next_attempt_at = models.DateTimeField(default=timezone.now)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["sent", "next_attempt_at"])]

    def __str__(self):
        return f"trace export of run {self.run_id}"

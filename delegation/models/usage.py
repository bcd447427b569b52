"""Usage rollups and budgets (SPEC §10)."""

from django.db import models
from django.utils import timezone

from delegation.models.runs import Run


class RunRollup(models.Model):
    """A run's own usage and its subtree's (itself included), kept current as rows commit.

    A table of its own so rollup updates lock these rows, never the runs: every writer takes
    run locks first and rollup rows last, in ascending pk order (ancestors before
    descendants), which is what keeps concurrent writers free of deadlocks. Costs are integer
    nano-dollars so sums are exact in every order.
    """

    run = models.OneToOneField(
        Run, primary_key=True, on_delete=models.CASCADE, related_name="rollup"
    )
    own_tokens_in = models.BigIntegerField(default=0)
    own_tokens_out = models.BigIntegerField(default=0)
    own_cache_read = models.BigIntegerField(default=0)
    own_cache_write = models.BigIntegerField(default=0)
    own_cost_nanos = models.BigIntegerField(default=0)
    own_usage_events = models.BigIntegerField(default=0)
    # Usage events with tokens but neither the agent's cost nor a price for their model: the
    # cost figures leave them out, and every view says the cost is incomplete (never $0).
    own_unpriced_usage = models.BigIntegerField(default=0)
    sub_unpriced_usage = models.BigIntegerField(default=0)
    # No secondary index on these: every usage frame updates them, and the lists sorted by
    # them are filtered first.
    sub_tokens_in = models.BigIntegerField(default=0)
    sub_tokens_out = models.BigIntegerField(default=0)
    sub_cache_read = models.BigIntegerField(default=0)
    sub_cache_write = models.BigIntegerField(default=0)
    sub_cost_nanos = models.BigIntegerField(default=0)
    sub_running = models.BigIntegerField(default=0)
    sub_succeeded = models.BigIntegerField(default=0)
    sub_failed = models.BigIntegerField(default=0)
    sub_cancelled = models.BigIntegerField(default=0)
    sub_lost = models.BigIntegerField(default=0)
    # The latest end of any run of the subtree: its wall time runs from the run's start to
    # this (or to now while any run of it is live).
    sub_last_finished_at = models.DateTimeField(null=True, blank=True)
    # The run has a Budget row (set with it): the usage UPDATE returns this, so a frame in a
    # tree without budgets needs no budget query.
    budgeted = models.BooleanField(default=False)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return f"rollup of run {self.run_id}"

    @property
    def sub_runs(self) -> int:
        return (
            self.sub_running
            + self.sub_succeeded
            + self.sub_failed
            + self.sub_cancelled
            + self.sub_lost
        )


class Budget(models.Model):
    """Limits on a run's whole subtree (SPEC §10). Empty limits are unbounded."""

    LIMITS = ("maxRuns", "maxLive", "maxTokens", "maxCostUsd", "maxSeconds")

    run = models.OneToOneField(
        Run, primary_key=True, on_delete=models.CASCADE, related_name="budget"
    )
    max_runs = models.BigIntegerField(null=True, blank=True)
    max_live = models.BigIntegerField(null=True, blank=True)
    max_tokens = models.BigIntegerField(null=True, blank=True)
    max_cost_nanos = models.BigIntegerField(null=True, blank=True)
    max_seconds = models.BigIntegerField(null=True, blank=True)
    set_by = models.CharField(max_length=160, blank=True)
    warned_at = models.DateTimeField(null=True, blank=True)
    exceeded_at = models.DateTimeField(null=True, blank=True, db_index=True)
    exceeded_reason = models.TextField(blank=True)
    # SPEC §14: at a limit, "cancel" the subtree (the default) or "pause" it and ask.
    on_limit = models.CharField(max_length=8, default="cancel", db_default="cancel")
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return f"budget of run {self.run_id}"


class ModelPrice(models.Model):
    """A model's list price (USD per million tokens), used when an agent reports tokens and
    a model but no cost (SPEC §10). Edited by admins (admin, REST; audited). A usage event is
    priced once, when it is stored: editing a price changes new events only."""

    model = models.CharField(max_length=200, unique=True)
    input_per_mtok = models.DecimalField(max_digits=12, decimal_places=6)
    output_per_mtok = models.DecimalField(max_digits=12, decimal_places=6)
    cache_read_per_mtok = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    cache_write_per_mtok = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    note = models.CharField(max_length=200, blank=True)
    updated_by = models.CharField(max_length=160, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["model"]

    def __str__(self):
        return f"price of {self.model}"

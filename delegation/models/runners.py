"""Runners, the presets their extensions register, and the token helpers every credential uses."""

import hashlib
import secrets

from django.db import models
from django.utils import timezone


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


class RunnerState(models.TextChoices):
    """A runner's connection state, derived from its columns (never stored on its own)."""

    CONNECTED = "connected", "Connected"
    # In its grace period after a disconnect, or never connected yet.
    DISCONNECTED = "disconnected", "Disconnected"
    LOST = "lost", "Lost"
    REVOKED = "revoked", "Revoked"


class RunnerQuerySet(models.QuerySet):
    def with_state(self):
        """Annotate ``state`` as ``Runner.state`` derives it, for ``values()`` rows and counts."""
        return self.annotate(
            state=models.Case(
                models.When(revoked_at__isnull=False, then=models.Value(RunnerState.REVOKED)),
                models.When(connected=True, then=models.Value(RunnerState.CONNECTED)),
                models.When(lost_at__isnull=False, then=models.Value(RunnerState.LOST)),
                default=models.Value(RunnerState.DISCONNECTED),
                output_field=models.CharField(max_length=16),
            )
        )


class Runner(models.Model):
    """An authenticated client process that hosts agents. ``name`` is its ``runnerId``."""

    name = models.CharField(max_length=128, unique=True)
    token_hash = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=16, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Bumped on every runner.register; a frame from an older generation is refused (fencing).
    connection_generation = models.PositiveBigIntegerField(default=0)
    channel_name = models.CharField(max_length=255, blank=True)
    host_instance_id = models.CharField(max_length=128, blank=True)
    workspace = models.CharField(max_length=8192, blank=True)
    declared_depth = models.PositiveBigIntegerField(null=True, blank=True)
    connected = models.BooleanField(default=False)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    disconnected_at = models.DateTimeField(null=True, blank=True)
    lost_at = models.DateTimeField(null=True, blank=True)

    objects = RunnerQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def runner_id(self):
        return self.name

    @property
    def is_active(self):
        return self.revoked_at is None

    @property
    def state(self) -> str:
        """Revoked wins over everything; a lost runner that reconnects is connected again."""
        if self.revoked_at is not None:
            return RunnerState.REVOKED
        if self.connected:
            return RunnerState.CONNECTED
        if self.lost_at is not None:
            return RunnerState.LOST
        return RunnerState.DISCONNECTED


class ExtensionPreset(models.Model):
    """A named execution profile registered by an extension, stamped with its generation."""

    runner = models.ForeignKey(Runner, on_delete=models.CASCADE, related_name="presets")
    extension_id = models.CharField(max_length=128)
    generation = models.PositiveBigIntegerField()
    name = models.CharField(max_length=128)
    options = models.JSONField(default=dict, blank=True)
    system_prompt = models.TextField(blank=True)
    # SPEC §11: the preset's approval policy {rules, default}, given to each run it starts.
    approvals = models.JSONField(null=True, blank=True)
    # SPEC §14: whether the preset's engine can start a child from a copy of its parent's
    # conversation (contextMode "fork"); one that cannot is refused at child.start.
    can_fork = models.BooleanField(default=False, db_default=False)
    registered_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["runner", "extension_id", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["runner", "extension_id", "name"], name="preset_unique_name"
            )
        ]

    def __str__(self):
        return f"{self.extension_id}/{self.name}@{self.generation}"

    def frozen(self) -> dict:
        """The preset as sent with child.execute: content, never a path."""
        preset = {"name": self.name, "systemPrompt": self.system_prompt}
        if self.options:
            preset["options"] = self.options
        return preset

"""Who did what and with which credential: the audit log, API tokens and run tokens."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from delegation.models.runs import Run


class AuditEntry(models.Model):
    """Who did what to which run or lease, when, why, and how it turned out."""

    class Via(models.TextChoices):
        RUNNER = "runner"
        MCP = "mcp"
        DASHBOARD = "dashboard"
        ADMIN = "admin"
        API = "api"
        SYSTEM = "system"

    actor = models.CharField(max_length=160)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    via = models.CharField(max_length=16, choices=Via.choices)
    action = models.CharField(max_length=32, db_index=True)
    target_type = models.CharField(max_length=16)
    target_id = models.CharField(max_length=128, db_index=True)
    reason = models.TextField(blank=True)
    outcome = models.CharField(max_length=64)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self):
        return f"{self.actor} {self.action} {self.target_type}:{self.target_id} -> {self.outcome}"


class ApiToken(models.Model):
    """A bearer token for scripts, acting with its user's role. Stored hashed."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=128, blank=True)
    token_hash = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=16, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # None: valid until revoked. Past it the token is refused like a revoked one.
    expires_at = models.DateTimeField(null=True, blank=True)
    # A read-only token reads like a viewer whatever its user's role; it never acts.
    read_only = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.user} {self.token_prefix}…"


class RunToken(models.Model):
    """A bearer token for ``/mcp`` that authorises exactly one run as the caller (SPEC §9).

    Stored hashed. Alive only while its run is running, before ``expires_at``, and while the
    runner still holds the token it had when this was issued (``runner_token_hash``): rotating
    or revoking the runner's token kills every run token it handed out.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="run_tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=16, blank=True)
    runner_token_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.run.run_id} {self.token_prefix}…"


# The kinds a webhook may subscribe to (SPEC §10 "Alerts"); "test" is sent only on request.

"""What identity providers and the retention pass leave behind (issue 28).

``SsoIdentity`` ties a Django user to the provider's subject, so a sign-in never matches a
local account by a claim the provider's user controls (such as email). ``RetentionPass`` is
one pass's record for the admin page; ``PurgedRun`` is the tombstone that lets a purged run's
page say what happened to it instead of answering 404.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone


class SsoIdentity(models.Model):
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    issuer = models.CharField(max_length=512)
    subject = models.CharField(max_length=255)
    # The role the provider's groups gave at the last sign-in or re-check.
    role = models.CharField(max_length=16, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # When the provider's claims were last read: a session, an API token or a live socket of
    # this user older than OIDC_RECHECK_SECONDS asks the provider again (issue 35).
    last_seen_at = models.DateTimeField(default=timezone.now)
    # The provider's tokens from the latest sign-in, to ask it again without a browser (an
    # API token's requests): userinfo with the access token, else one refresh.
    access_token = models.TextField(blank=True, default="")
    refresh_token = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = "SSO identity"
        # Django's default adds an "s" (issue 38: "sso identitys", "retention passs").
        verbose_name_plural = "SSO identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique")
        ]

    def __str__(self):
        return f"{self.subject}@{self.issuer}"


class RetentionPass(models.Model):
    started_at = models.DateTimeField(default=timezone.now, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    events_deleted = models.PositiveBigIntegerField(default=0)
    runs_deleted = models.PositiveBigIntegerField(default=0)
    trees_deleted = models.PositiveBigIntegerField(default=0)
    audit_deleted = models.PositiveBigIntegerField(default=0)
    batches = models.PositiveIntegerField(default=0)
    # Set when the pass stopped on an error; what it deleted before that stays deleted.
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        verbose_name_plural = "retention passes"

    def __str__(self):
        return f"retention pass {self.pk} at {self.started_at:%Y-%m-%d %H:%M}"

    @property
    def rows_deleted(self) -> int:
        return self.events_deleted + self.runs_deleted + self.audit_deleted

    @property
    def seconds(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


class PurgedRun(models.Model):
    run_id = models.CharField(max_length=128, unique=True)
    root_run_id = models.CharField(max_length=128)
    finished_at = models.DateTimeField(null=True, blank=True)
    purged_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return f"{self.run_id} (purged)"

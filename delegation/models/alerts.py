"""Webhooks and their deliveries (SPEC §10 alerts)."""

from django.db import models
from django.utils import timezone

ALERT_KINDS = (
    "budget-warning",
    "budget-exceeded",
    "run-failed",
    "run-lost",
    "runner-lost",
    "approval-requested",
    "budget-paused",
)


class Webhook(models.Model):
    """An admin-configured receiver of alerts: where, the signing secret, which kinds."""

    name = models.CharField(max_length=128, blank=True)
    url = models.CharField(max_length=2048)
    # Kept in the clear: every delivery is signed with it (HMAC-SHA256), so it cannot be hashed.
    secret = models.CharField(max_length=256)
    kinds = models.JSONField(default=list)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=160, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return self.name or self.url


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    GIVEN_UP = "given-up", "Given up"


class WebhookDelivery(models.Model):
    """One alert for one webhook, stored with the change that caused it and sent later by the
    upkeep loop. ``body`` holds the exact bytes sent and signed, so every retry is identical."""

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    delivery_id = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=32)
    body = models.TextField()
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    # Due time while pending; a sender claims a delivery by moving it into the future.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["state", "next_attempt_at"])]

    def __str__(self):
        return f"{self.kind} {self.delivery_id} {self.state}"


class WebhookAttempt(models.Model):
    """One POST of a delivery: when, how long, the HTTP status or the network error."""

    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["delivery", "number"]

    def __str__(self):
        return f"{self.delivery.delivery_id} #{self.number}: {self.status_code or self.error}"

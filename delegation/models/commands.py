"""Server-to-runner commands (the outbox) and steer receipts."""

from django.db import models
from django.utils import timezone

from delegation.models.runners import Runner
from delegation.models.runs import Run, Session


class SteerReceipt(models.Model):
    """The one record of a steer: its requestId (idempotency), message and outcome; the
    ``run.steer`` command and the audit entry link here instead of repeating them.

    ``injected`` means queued for the runner; a runner that then answers ``run.steer`` with
    anything else (say ``promptRequired``: the turn ended first) marks it undelivered, with
    the runner's own outcome and reason. The answer to a repeated requestId stays the first.
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="steer_receipts")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steer_receipts")
    request_id = models.CharField(max_length=128)
    message = models.TextField()
    outcome = models.CharField(max_length=32)
    reason = models.CharField(max_length=64, blank=True)
    actor = models.CharField(max_length=160, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    audit_entry = models.OneToOneField(
        "AuditEntry",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="steer_receipt",
    )
    undelivered_at = models.DateTimeField(null=True, blank=True)
    runner_outcome = models.CharField(max_length=32, blank=True)
    runner_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["session", "request_id"], name="steer_unique_request")
        ]

    def __str__(self):
        return f"{self.session.conversation_id}:{self.request_id} {self.outcome}"

    @property
    def delivery(self) -> str:
        """delivered (the runner answered ``injected``), queued (injected, no answer yet),
        undelivered (the runner refused it), or not-sent (promptRequired). ``accepted`` is
        annotated by ``selectors.steer_receipts``; without it, the receipt's commands say."""
        if self.outcome != "injected":
            return "not-sent"
        if self.undelivered_at is not None:
            return "undelivered"
        accepted = getattr(self, "accepted", None)
        if accepted is None:
            accepted = self.commands.filter(
                answered_at__isnull=False, result__outcome="injected"
            ).exists()
        return "delivered" if accepted else "queued"


class Command(models.Model):
    """Outbox of server-to-runner requests: stored before sent, resent until answered."""

    class Method(models.TextChoices):
        CHILD_EXECUTE = "child.execute"
        RUN_EXECUTE = "run.execute"
        RUN_CANCEL = "run.cancel"
        RUN_STEER = "run.steer"
        RUN_PAUSE = "run.pause"
        RUN_RESUME = "run.resume"
        LEASE_REVOKED = "lease.revoked"
        APPROVAL_DECIDED = "approval.decided"
        # SPEC §15: a hosted kodelet extension's tool, called through /mcp; answered with
        # the tool's result (docs/explanation/spec-deviations.md).
        EXTENSION_TOOL_CALL = "extension.tool.call"

    runner = models.ForeignKey(Runner, on_delete=models.CASCADE, related_name="commands")
    method = models.CharField(max_length=32, choices=Method.choices)
    params = models.JSONField()
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE)
    # A run.steer carries its requestId and message from here, not a copy in ``params``.
    steer = models.ForeignKey(
        SteerReceipt, null=True, blank=True, on_delete=models.CASCADE, related_name="commands"
    )
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)
    sent_generation = models.PositiveBigIntegerField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    answered_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["runner", "answered_at", "id"])]

    def __str__(self):
        return f"{self.method} #{self.pk}"

    @property
    def rpc_id(self) -> str:
        return f"srv-{self.pk}"

    def wire_params(self) -> dict:
        """The params as sent to the runner."""
        if self.steer_id is None:
            return self.params
        return {**self.params, "requestId": self.steer.request_id, "message": self.steer.message}

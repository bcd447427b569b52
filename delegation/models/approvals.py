"""Approvals (SPEC §11): one row per tool use an agent asked to make, and run policies."""

from django.db import models
from django.utils import timezone

from delegation.models.runs import Run


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DECIDED = "decided", "Decided"
    EXPIRED = "expired", "Expired (no decision in time)"


class Approval(models.Model):
    """A request to use a tool, and (once made) its one decision.

    ``via`` is the door it came by: ``runner`` (``approval.request``; the decision goes back
    as an ``approval.decided`` command) or ``mcp`` (the ``approve`` tool; the waiting call
    answers the agent itself). ``can_edit`` says whether that door can run an operator's
    edited input: an ACP agent answers a permission request with an option id only, so its
    runner asks with ``canEdit: false`` and such an approval is allowed or denied as asked.
    """

    approval_id = models.CharField(max_length=64, unique=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    # The tree's top, denormalised so "every pending approval of this tree" is one index.
    root = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    via = models.CharField(max_length=16)
    can_edit = models.BooleanField(default=True)
    tool_call_id = models.CharField(max_length=255, blank=True)
    tool_name = models.CharField(max_length=255)
    kind = models.CharField(max_length=16, blank=True)
    title = models.CharField(max_length=1024, blank=True)
    input = models.JSONField(null=True, blank=True)
    status = models.CharField(
        max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    decision = models.CharField(max_length=8, blank=True)
    message = models.TextField(blank=True)
    updated_input = models.JSONField(null=True, blank=True)
    scope = models.CharField(max_length=8, blank=True)
    # policy, operator:<name>, timeout, cancel
    decided_by = models.CharField(max_length=160, blank=True)
    requested_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["requested_at", "id"]
        indexes = [
            models.Index(fields=["status", "requested_at"]),
            models.Index(fields=["run", "status"]),
            models.Index(fields=["root", "status"]),
        ]
        constraints = [
            # A repeated request for the same tool call is the same approval.
            models.UniqueConstraint(
                fields=["run", "tool_call_id"],
                condition=~models.Q(tool_call_id=""),
                name="approval_unique_tool_call",
            )
        ]

    def __str__(self):
        return f"{self.approval_id} {self.tool_name} {self.status}"


class ApprovalPolicy(models.Model):
    """A run's own policy ``{rules, default}``; its effective decision also weighs every
    ancestor's (strictest wins). ``source`` says who set it last: an ``agent``'s policy may
    deny or ask but never allows on its own (agents are untrusted)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="approval_policy")
    rules = models.JSONField(default=list)
    default = models.CharField(max_length=8, default="ask")
    source = models.CharField(max_length=16, default="operator")
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        # Django's default adds an "s": "approval policys" in the admin (issue 38).
        verbose_name_plural = "approval policies"

    def __str__(self):
        return f"policy of {self.run_id}"

    def wire(self) -> dict:
        return {"rules": self.rules, "default": self.default}

"""The record. Every session, run, event, lease, steer receipt, command and audit entry.

One module per domain; everything is importable from ``delegation.models`` as before.
"""

from delegation.models.access import ApiToken, AuditEntry, RunToken
from delegation.models.alerts import (
    ALERT_KINDS,
    DeliveryState,
    Webhook,
    WebhookAttempt,
    WebhookDelivery,
)
from delegation.models.approvals import Approval, ApprovalPolicy, ApprovalStatus
from delegation.models.commands import Command, SteerReceipt
from delegation.models.runners import (
    ExtensionPreset,
    Runner,
    RunnerQuerySet,
    RunnerState,
    hash_token,
    new_token,
)
from delegation.models.runs import (
    ACTIVITY_CHARS,
    TASK_CHARS,
    TERMINAL_STATUSES,
    Event,
    Lease,
    LeaseState,
    Run,
    RunQuerySet,
    RunStatus,
    RunVia,
    Session,
)
from delegation.models.tracing import TraceExport
from delegation.models.upkeep import PurgedRun, RetentionPass, SsoIdentity
from delegation.models.usage import Budget, ModelPrice, RunRollup

__all__ = [
    "ACTIVITY_CHARS",
    "ALERT_KINDS",
    "TASK_CHARS",
    "TERMINAL_STATUSES",
    "ApiToken",
    "Approval",
    "ApprovalPolicy",
    "ApprovalStatus",
    "AuditEntry",
    "Budget",
    "Command",
    "DeliveryState",
    "Event",
    "ExtensionPreset",
    "Lease",
    "PurgedRun",
    "RetentionPass",
    "LeaseState",
    "ModelPrice",
    "Run",
    "RunQuerySet",
    "RunRollup",
    "RunStatus",
    "RunToken",
    "RunVia",
    "Runner",
    "RunnerQuerySet",
    "RunnerState",
    "Session",
    "SsoIdentity",
    "SteerReceipt",
    "TraceExport",
    "Webhook",
    "WebhookAttempt",
    "WebhookDelivery",
    "hash_token",
    "new_token",
]

"""The record. Every session, run, event, lease, steer receipt, command and audit entry."""

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


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


class ExtensionPreset(models.Model):
    """A named execution profile registered by an extension, stamped with its generation."""

    runner = models.ForeignKey(Runner, on_delete=models.CASCADE, related_name="presets")
    extension_id = models.CharField(max_length=128)
    generation = models.PositiveBigIntegerField()
    name = models.CharField(max_length=128)
    options = models.JSONField(default=dict, blank=True)
    system_prompt = models.TextField(blank=True)
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


class RunStatus(models.TextChoices):
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    LOST = "lost", "Lost"


TERMINAL_STATUSES = (
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.CANCELLED,
    RunStatus.LOST,
)


class LeaseState(models.TextChoices):
    ACTIVE = "active", "Active"
    RELEASED = "released", "Released"
    EXPIRED = "expired", "Expired"
    REVOKED = "revoked", "Revoked (runner lost)"
    # Released before it ever existed: stops a late child.start from recreating it.
    TOMBSTONE = "tombstone", "Tombstone"


class Lease(models.Model):
    """A retained grant letting an extension keep managing its children after the run ends."""

    runner = models.ForeignKey(Runner, on_delete=models.CASCADE, related_name="leases")
    lease_id = models.CharField(max_length=128)
    extension_id = models.CharField(max_length=128)
    generation = models.PositiveBigIntegerField()
    parent_run = models.ForeignKey(
        "Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="leases"
    )
    state = models.CharField(max_length=16, choices=LeaseState.choices, default=LeaseState.ACTIVE)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["runner", "lease_id"], name="lease_unique_per_runner")
        ]
        indexes = [models.Index(fields=["state", "expires_at"])]

    def __str__(self):
        return f"{self.runner.name}:{self.lease_id}"

    def is_live(self, now=None) -> bool:
        now = now or timezone.now()
        return self.state == LeaseState.ACTIVE and self.expires_at > now


class Session(models.Model):
    """A persisted conversation with a fixed depth; ``conversation_id`` is a child's childId."""

    conversation_id = models.CharField(max_length=128, unique=True)
    runner = models.ForeignKey(Runner, on_delete=models.PROTECT, related_name="sessions")
    depth = models.PositiveBigIntegerField()
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    extension_id = models.CharField(max_length=128, blank=True)
    profile = models.CharField(max_length=128, blank=True)
    host_instance_id = models.CharField(max_length=128, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return self.conversation_id


class RunQuerySet(models.QuerySet):
    """The recurring questions about runs, each written once."""

    def in_tree(self, root):
        """Every run of the tree whose top is ``root`` (a root run, its pk, or an expression
        giving that pk): the root itself and every run below it, through the denormalised
        ``root`` column so both arms of the OR are index lookups."""
        root_pk = root.pk if isinstance(root, Run) else root
        return self.filter(models.Q(pk=root_pk) | models.Q(root_id=root_pk))

    def in_trees(self, root_pks):
        """Every run of any of the trees topped by ``root_pks``."""
        root_pks = list(root_pks)
        return self.filter(models.Q(pk__in=root_pks) | models.Q(root_id__in=root_pks))

    def live(self):
        """Runs not yet in a terminal status."""
        return self.exclude(status__in=TERMINAL_STATUSES)


class RunVia(models.TextChoices):
    RUNNER = "runner", "Runner"
    MCP = "mcp", "MCP"
    LAUNCH = "launch", "Launched by an operator"


TASK_CHARS = 200
ACTIVITY_CHARS = 200


class Run(models.Model):
    """One execution within a session. A resume creates a new run in the same session."""

    run_id = models.CharField(max_length=128, unique=True)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="runs")
    runner = models.ForeignKey(Runner, on_delete=models.PROTECT, related_name="runs")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    # The top of the delegation tree, so a whole tree is one indexed filter away.
    root = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="descendants"
    )
    # Materialised path: the pks of every ancestor, root first. Rollups and budgets walk it
    # instead of following ``parent`` one query per level.
    ancestry = models.JSONField(default=list, blank=True)
    depth = models.PositiveBigIntegerField()
    status = models.CharField(
        max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING, db_index=True
    )
    done = models.BooleanField(default=False)
    cancelled = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    output = models.TextField(blank=True)
    extension_id = models.CharField(max_length=128, blank=True)
    generation = models.PositiveBigIntegerField(null=True, blank=True)
    profile = models.CharField(max_length=128, blank=True)
    host_instance_id = models.CharField(max_length=128, blank=True)
    # child.start bookkeeping: the tool call that started it (foreground children die with
    # it), the lease it runs under, and the request for idempotent replays.
    tool_call_id = models.CharField(max_length=128, blank=True)
    lease = models.ForeignKey(
        Lease, null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    request_id = models.CharField(max_length=128, blank=True)
    request = models.JSONField(null=True, blank=True)
    request_fingerprint = models.CharField(max_length=64, blank=True)
    preset = models.JSONField(null=True, blank=True)
    options = models.JSONField(default=dict, blank=True)
    context_mode = models.CharField(max_length=8, blank=True)
    cwd = models.CharField(max_length=8192, blank=True)
    # What a tree row shows without reading the stream: the first line of the request
    # message, and the latest text or tool call, written in the same transaction as the
    # append so a row is current the moment the events are.
    task = models.CharField(max_length=TASK_CHARS, blank=True)
    activity = models.CharField(max_length=ACTIVITY_CHARS, blank=True)
    activity_at = models.DateTimeField(null=True, blank=True)
    # The stream: last_sequence is the head; emitted counts runner events stored so far.
    last_sequence = models.PositiveBigIntegerField(default=0)
    emitted = models.PositiveBigIntegerField(default=0)
    refused_spawns = models.PositiveIntegerField(default=0)
    # Which door the run came through: a runner's own call, an agent's MCP tool call, or an
    # operator's launch. Operators filter on it; it never changes a rule.
    via = models.CharField(max_length=16, choices=RunVia.choices, default=RunVia.RUNNER)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["parent", "status"]),
            models.Index(fields=["root", "depth"]),
            models.Index(fields=["runner", "status"]),
            models.Index(fields=["lease", "status"]),
        ]
        constraints = [
            # Backstop for child.start idempotency: one child per requestId under a parent.
            models.UniqueConstraint(
                fields=["parent", "request_id"],
                condition=~models.Q(request_id=""),
                name="run_unique_request_per_parent",
            )
        ]

    def __str__(self):
        return self.run_id

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def parent_run_id(self) -> str:
        return self.parent.run_id if self.parent_id else ""


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
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return f"budget of run {self.run_id}"


class Event(models.Model):
    """One step of a run's stream, numbered by the server from 1 without gaps."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    sequence = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=64)
    # The runner's own 1-based index of this event (null for the server's events).
    runner_index = models.PositiveBigIntegerField(null=True, blank=True)
    # NULL means "absent", which the wire keeps distinct from "" (an empty text delta).
    text = models.TextField(null=True, blank=True)  # noqa: DJ001
    tool_name = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    tool_call_id = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    input = models.JSONField(null=True, blank=True)
    tool_output = models.JSONField(null=True, blank=True)
    success = models.BooleanField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)  # noqa: DJ001
    truncated = models.BooleanField(default=False)
    # Who caused a server event (a steer or a cancel), as "user:alice" or "runner:ci-1".
    actor = models.CharField(max_length=160, blank=True)
    data = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["run", "sequence"], name="event_unique_sequence")
        ]

    def __str__(self):
        return f"{self.run.run_id}#{self.sequence} {self.kind}"


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
        """queued (injected, no refusal heard), undelivered, or not-sent (promptRequired)."""
        if self.outcome != "injected":
            return "not-sent"
        return "undelivered" if self.undelivered_at is not None else "queued"


class Command(models.Model):
    """Outbox of server-to-runner requests: stored before sent, resent until answered."""

    class Method(models.TextChoices):
        CHILD_EXECUTE = "child.execute"
        RUN_EXECUTE = "run.execute"
        RUN_CANCEL = "run.cancel"
        RUN_STEER = "run.steer"
        LEASE_REVOKED = "lease.revoked"

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
ALERT_KINDS = ("budget-warning", "budget-exceeded", "run-failed", "run-lost", "runner-lost")


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

"""Sessions, runs, their events, and the leases that outlive a run's turn."""

from django.db import models
from django.utils import timezone

from delegation.models.runners import Runner


class RunStatus(models.TextChoices):
    RUNNING = "running", "Running"
    # SPEC §14: stopped by an operator (or its budget) until resumed; live, not terminal.
    PAUSED = "paused", "Paused"
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
    # What the run says it achieved (SPEC §9 Conclusions): the validated shape of
    # delegation.wire.conclusions, from the conclude tool or a canopy-conclusion block.
    conclusion = models.JSONField(null=True, blank=True)
    # Which door the run came through: a runner's own call, an agent's MCP tool call, or an
    # operator's launch. Operators filter on it; it never changes a rule.
    via = models.CharField(max_length=16, choices=RunVia.choices, default=RunVia.RUNNER)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.TextField(blank=True)
    # SPEC §14 pause: while paused, ``paused_at`` is when it stopped; ``paused_seconds`` is
    # the time of every pause already ended, kept so maxSeconds counts only running time.
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_seconds = models.FloatField(default=0.0, db_default=0.0)
    pause_reason = models.TextField(blank=True, db_default="")
    # SPEC §14: the agent's own session id (Claude Code's ``session_id``), from the runner's
    # ``session`` event; what a fork of this run resumes.
    agent_session_id = models.CharField(max_length=128, blank=True, db_default="")
    # A launch that started again from this run's preset, message and budget (relaunch).
    relaunched_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="relaunches"
    )
    # SPEC §14 fork from here: the run whose agent conversation this one continues, and the
    # step (event sequence) it was forked at (null: from its end).
    forked_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks"
    )
    forked_from_sequence = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Retention (issue 28): on a root, the whole tree is exempt from every pass; on any run,
    # when a pass deleted its transcript (its usage events stay: rollups are counted from them).
    # db_default: rows inserted by raw SQL (bench.tree_seed) get it too.
    keep = models.BooleanField(default=False, db_default=False)
    events_purged_at = models.DateTimeField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["parent", "status"]),
            models.Index(fields=["root", "depth"]),
            models.Index(fields=["runner", "status"]),
            models.Index(fields=["lease", "status"]),
            # The retention pass's scan: finished runs by age.
            models.Index(fields=["finished_at"], name="run_finished_at_idx"),
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

    def paused_for(self, now) -> float:
        """Seconds this run has spent paused up to ``now``, the pause in course included."""
        current = (now - self.paused_at).total_seconds() if self.paused_at else 0.0
        return self.paused_seconds + max(current, 0.0)


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

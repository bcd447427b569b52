"""Runner connections: register (fencing older sockets), disconnect, touch, loss."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from delegation import notify
from delegation.errors import NOT_REGISTERED, STALE_CONNECTION, RpcError
from delegation.models import (
    Command,
    ExtensionPreset,
    Lease,
    LeaseState,
    Run,
    Runner,
    RunStatus,
)
from delegation.services import approvals, rollups, webhooks
from delegation.services.audit import audit
from delegation.services.base import lock_run
from delegation.services.identity import Actor, Connection
from delegation.services.lifecycle import mark_finished
from delegation.services.locks import retry_conflicts
from delegation.services.run_actions import do_release_lease
from delegation.wire import RegisterParams

RUNNER_LOST_ERROR = "runner lost"


def current_runner(conn: Connection, lock: bool = True) -> Runner:
    """The caller's runner, refusing frames from a fenced (older) connection."""
    runners = Runner.objects.select_for_update(no_key=True) if lock else Runner.objects
    runner = runners.get(pk=conn.runner_pk)
    check_fence(conn, runner.revoked_at is not None, runner.connection_generation)
    return runner


def check_fence(conn: Connection, revoked: bool, generation: int) -> None:
    """Refuse a connection whose token was revoked or whose registration was replaced."""
    if revoked:
        raise RpcError(STALE_CONNECTION, "runner token was revoked")
    if conn.generation == 0:
        raise RpcError(NOT_REGISTERED, "not registered: the first call must be runner.register")
    if generation != conn.generation:
        raise RpcError(
            STALE_CONNECTION,
            f"stale connection: generation {conn.generation} was replaced by {generation}",
        )


@retry_conflicts
def register(conn: Connection, params: RegisterParams) -> tuple[dict, int, str]:
    """Bump the generation (fencing every older connection) and replace the presets."""
    with transaction.atomic(), rollups.batch():
        runner = Runner.objects.select_for_update(no_key=True).get(pk=conn.runner_pk)
        if runner.revoked_at is not None:
            raise RpcError(STALE_CONNECTION, "runner token was revoked")
        if conn.credential and conn.credential != runner.token_hash:
            raise RpcError(STALE_CONNECTION, "runner token was rotated; connect with the new one")
        previous_channel = runner.channel_name
        previous_host = runner.host_instance_id
        runner.connection_generation += 1
        runner.channel_name = conn.channel_name
        runner.host_instance_id = params.host_instance_id
        runner.workspace = params.workspace or ""
        runner.declared_depth = conn.declared_depth
        runner.connected = True
        runner.last_seen_at = timezone.now()
        runner.disconnected_at = None
        runner.lost_at = None
        runner.save()
        if previous_host and previous_host != params.host_instance_id:
            _abandon_host_instance(runner, previous_host, params.host_instance_id)
        # Checked before anything is replaced: a bad preset policy refuses the registration.
        policies = {
            (ext.extension_id, preset.name): approvals.check_policy(
                preset.approvals, f"extensions.{ext.extension_id}.presets.{preset.name}.approvals"
            )
            for ext in params.extensions
            for preset in ext.presets
            if preset.approvals is not None
        }
        ExtensionPreset.objects.filter(runner=runner).delete()
        ExtensionPreset.objects.bulk_create(
            ExtensionPreset(
                runner=runner,
                extension_id=ext.extension_id,
                generation=ext.generation,
                name=preset.name,
                options=preset.options.wire() if preset.options is not None else {},
                system_prompt=preset.system_prompt,
                approvals=policies.get((ext.extension_id, preset.name)),
                can_fork=bool(preset.can_fork),
            )
            for ext in params.extensions
            for preset in ext.presets
        )
        # Everything not yet answered goes out again on this connection.
        Command.objects.filter(runner=runner, answered_at__isnull=True).update(sent_generation=None)
        notify.runner_changed(runner.pk)
    result = {"runnerId": runner.name, "connectionGeneration": runner.connection_generation}
    fenced = previous_channel if previous_channel != conn.channel_name else ""
    return result, runner.connection_generation, fenced


def _abandon_host_instance(runner: Runner, previous: str, current: str) -> None:
    """A new host instance means the old process is gone, with the runs it was executing.

    Without this, a runner restarted within the grace period would leave those runs
    "running" forever: it never counts as lost, and nothing is left to resend.
    """
    error = f"{RUNNER_LOST_ERROR}: host instance {previous} was replaced by {current}"
    pks = list(
        Run.objects.filter(runner=runner, host_instance_id=previous)
        .live()
        .values_list("pk", flat=True)
    )
    for pk in pks:
        mark_finished(lock_run(pk), RunStatus.LOST, error=error)
    # Their commands would reach a process that never heard of them.
    Command.objects.filter(run_id__in=pks, answered_at__isnull=True).update(
        answered_at=timezone.now(), result={"dropped": error}
    )


@retry_conflicts
def runner_disconnected(conn: Connection) -> None:
    """Start the grace period, unless a newer connection already took over."""
    with transaction.atomic():
        updated = Runner.objects.filter(
            pk=conn.runner_pk, connection_generation=conn.generation, connected=True
        ).update(connected=False, disconnected_at=timezone.now(), channel_name="")
        if updated:
            notify.runner_changed(conn.runner_pk)


def fence_runner(runner_pk: int, why: str = "credential revoked") -> None:
    """End the authority of every open connection of a runner, at once and everywhere.

    Call it in the transaction that revokes or replaces the runner's credential. The
    generation moves on, so every frame, answer and command claim of an older connection is
    refused from the commit on (whatever process holds the socket); the runner counts as
    disconnected, so its grace period starts unless it comes back with a valid credential;
    unanswered commands wait for that new connection. After commit, every socket of the
    runner is told on the channel layer to close with 4401; a socket whose process misses
    the message is refused on its next frame and stops being fed commands anyway.
    """
    runner = Runner.objects.select_for_update(no_key=True).get(pk=runner_pk)
    runner.connection_generation += 1
    if runner.connected:
        runner.connected = False
        runner.disconnected_at = timezone.now()
    runner.channel_name = ""
    runner.save(
        update_fields=["connection_generation", "connected", "disconnected_at", "channel_name"]
    )
    Command.objects.filter(runner=runner, answered_at__isnull=True).update(sent_generation=None)
    notify.runner_fenced(runner_pk, why)
    notify.runner_changed(runner_pk)


def touch_runner(conn: Connection) -> None:
    Runner.objects.filter(pk=conn.runner_pk, connection_generation=conn.generation).update(
        last_seen_at=timezone.now()
    )


def touch_runners(conns) -> None:
    """``touch_runner`` for every connection in one statement (a process's keep-alive)."""
    current = Q(pk__in=[])
    for conn in conns:
        current |= Q(pk=conn.runner_pk, connection_generation=conn.generation)
    Runner.objects.filter(current).update(last_seen_at=timezone.now())


def lose_runner(runner: Runner, now) -> None:
    lost = Actor.system("system:runner-lost")
    runner.lost_at = now
    runner.save(update_fields=["lost_at"])
    for lease in Lease.objects.filter(runner=runner, state=LeaseState.ACTIVE):
        do_release_lease(lost, lease, state=LeaseState.REVOKED)
    lost_runs = []
    for pk in Run.objects.filter(runner=runner).live().values_list("pk", flat=True):
        run = lock_run(pk)
        mark_finished(run, RunStatus.LOST, error=RUNNER_LOST_ERROR)
        lost_runs.append(run.run_id)
    audit(lost, "runner-lost", "runner", runner.name, "lost")
    webhooks.runner_lost(runner, lost_runs)
    notify.runner_changed(runner.pk)

"""Reads of runners: the live socket's and the runners page's rows, the REST list."""

from __future__ import annotations

from django.db.models import Count, F

from delegation.models import Command, ExtensionPreset, Lease, LeaseState, Run, Runner, RunStatus
from delegation.selectors.events import millis


def runner_states() -> list[dict]:
    """Every runner's connection state and presets, as the live socket sends them."""
    return [
        {
            "runnerId": runner.name,
            "connected": runner.connected,
            "generation": runner.connection_generation,
            "hostInstanceId": runner.host_instance_id,
            "lastSeenAt": millis(runner.last_seen_at),
            "lostAt": millis(runner.lost_at),
            "revoked": runner.revoked_at is not None,
            # Runner.state's one definition (revoked first): the page shows it, never derives it.
            "state": str(runner.state),
            "presets": [
                {"extensionId": p.extension_id, "generation": p.generation, "name": p.name}
                for p in runner.presets.all()
            ],
        }
        for runner in Runner.objects.prefetch_related("presets").order_by("name")
    ]


def launch_choices() -> list[dict]:
    """Connected runners and the presets each offers: what an operator may launch."""
    return [
        {
            "name": runner.name,
            "presets": [
                {
                    "extensionId": p.extension_id,
                    "name": p.name,
                    "value": f"{p.extension_id}/{p.name}",
                }
                for p in runner.presets.all()
            ],
        }
        for runner in Runner.objects.filter(connected=True, revoked_at__isnull=True)
        .prefetch_related("presets")
        .order_by("name")
    ]


def runner_overview() -> list[dict]:
    """Every runner with its presets, running runs and active leases, for the runners page."""
    running = dict(
        Run.objects.filter(status=RunStatus.RUNNING)
        .values("runner_id")
        .annotate(n=Count("id"))
        .values_list("runner_id", "n")
    )
    leases = dict(
        Lease.objects.filter(state=LeaseState.ACTIVE)
        .values("runner_id")
        .annotate(n=Count("id"))
        .values_list("runner_id", "n")
    )
    return [
        {
            "runner": runner,
            "presets": list(runner.presets.all()),
            "running": running.get(runner.pk, 0),
            "leases": leases.get(runner.pk, 0),
            "last_seen_ms": millis(runner.last_seen_at),
        }
        for runner in Runner.objects.prefetch_related("presets").order_by("name")
    ]


def runner_names():
    return Runner.objects.values_list("name", flat=True)


def runners_matching(*, connected=None, name=None):
    runners = Runner.objects.with_state()
    if connected is not None:
        runners = runners.filter(connected=connected)
    if name is not None:
        runners = runners.filter(name=name)
    return runners.values(
        "pk",
        "connected",
        "workspace",
        "state",
        runnerId=F("name"),
        connectionGeneration=F("connection_generation"),
        hostInstanceId=F("host_instance_id"),
        declaredDepth=F("declared_depth"),
        createdAt=F("created_at"),
        revokedAt=F("revoked_at"),
        lastSeenAt=F("last_seen_at"),
        disconnectedAt=F("disconnected_at"),
        lostAt=F("lost_at"),
    )


def run_counts_of_runner(runner_pk: int) -> dict[str, int]:
    rows = Run.objects.filter(runner_id=runner_pk).values("status").annotate(n=Count("id"))
    return {row["status"]: row["n"] for row in rows.order_by()}


def presets_of_runner(runner_pk: int) -> list:
    return list(
        ExtensionPreset.objects.filter(runner_id=runner_pk).order_by("extension_id", "name")
    )


def fence_states(runner_pks) -> dict[int, tuple[int, bool, str]]:
    """pk -> (connection generation, revoked, token hash) of each runner, for the socket
    fence watch of every server process."""
    rows = Runner.objects.filter(pk__in=list(runner_pks)).values_list(
        "pk", "connection_generation", "revoked_at", "token_hash"
    )
    return {pk: (generation, revoked is not None, token) for pk, generation, revoked, token in rows}


def command_answer(command_pk: int, runner_pk: int) -> dict | None:
    """A command of this runner, as ``{"answered_at", "result"}`` (None: no such command)."""
    return (
        Command.objects.filter(pk=command_pk, runner_id=runner_pk)
        .values("answered_at", "result")
        .first()
    )


def runners_with_unsent(conns) -> set[int]:
    """The runners among ``conns`` (registered sockets' connections) with a command not yet
    answered nor sent on that connection's generation: what ``outbox.claim_commands`` would
    claim for them. One read for a whole process's sockets, so its keep-alive claims only for
    the few that have something to send."""
    generation = {conn.runner_pk: conn.generation for conn in conns}
    rows = (
        Command.objects.filter(runner_id__in=list(generation), answered_at__isnull=True)
        .values_list("runner_id", "sent_generation")
        .distinct()
    )
    return {pk for pk, sent in rows if sent != generation[pk]}

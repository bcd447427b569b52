"""The outbox of server-to-runner requests: enqueue, and claim for a connection (what the
answers change is in ``answers``)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from delegation import notify
from delegation.models import Command, Run, Runner, SteerReceipt
from delegation.services.identity import Connection
from delegation.services.locks import retry_conflicts


def enqueue(
    runner_pk: int,
    method: str,
    params: dict,
    run: Run | None = None,
    steer: SteerReceipt | None = None,
) -> Command:
    command = Command.objects.create(
        runner_id=runner_pk, method=method, params=params, run=run, steer=steer
    )
    notify.runner_outbox(runner_pk)
    return command


CLAIM_LIMIT = 100


@retry_conflicts
def claim_commands(conn: Connection, limit: int = CLAIM_LIMIT) -> list[Command]:
    """Commands this connection has not sent yet, marked as sent on its generation."""
    with transaction.atomic():
        runner = Runner.objects.filter(pk=conn.runner_pk).values("connection_generation").first()
        if runner is None or runner["connection_generation"] != conn.generation:
            return []
        commands = list(
            Command.objects.select_for_update(of=("self",))
            .select_related("steer")
            .filter(runner_id=conn.runner_pk, answered_at__isnull=True)
            .exclude(sent_generation=conn.generation)
            .order_by("id")[:limit]
        )
        now = timezone.now()
        for command in commands:
            command.sent_generation = conn.generation
            command.sent_at = now
            command.attempts += 1
        Command.objects.bulk_update(commands, ["sent_generation", "sent_at", "attempts"])
        return commands

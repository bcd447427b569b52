"""The outbox of server-to-runner requests: enqueue, claim for a connection, and answers."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from delegation import notify
from delegation.models import Command, Run, Runner, RunStatus
from delegation.services.base import Connection, lock_run, mark_finished


def enqueue(runner_pk: int, method: str, params: dict, run: Run | None = None) -> Command:
    command = Command.objects.create(runner_id=runner_pk, method=method, params=params, run=run)
    notify.runner_outbox(runner_pk)
    return command


def claim_commands(conn: Connection, limit: int = 100) -> list[Command]:
    """Commands this connection has not sent yet, marked as sent on its generation."""
    with transaction.atomic():
        runner = Runner.objects.filter(pk=conn.runner_pk).values("connection_generation").first()
        if runner is None or runner["connection_generation"] != conn.generation:
            return []
        commands = list(
            Command.objects.select_for_update()
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


def command_answered(conn: Connection, command_pk: int, result=None, error=None) -> None:
    """A runner answered a server request; a refused child.execute fails the child."""
    with transaction.atomic():
        command = (
            Command.objects.select_for_update()
            .filter(pk=command_pk, runner_id=conn.runner_pk, answered_at__isnull=True)
            .first()
        )
        if command is None:
            return
        command.answered_at = timezone.now()
        command.result = {"error": error} if error is not None else result
        command.save(update_fields=["answered_at", "result"])
        if error is not None and command.method == Command.Method.CHILD_EXECUTE and command.run_id:
            run = lock_run(command.run_id)
            if not run.is_terminal:
                message = error.get("message", "") if isinstance(error, dict) else str(error)
                mark_finished(
                    run, RunStatus.FAILED, error=f"runner refused child.execute: {message}"
                )

"""A runner's answers to server requests: stored on their command, then acted on by method."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from delegation.models import AuditEntry, Command, Runner, RunStatus, SteerReceipt
from delegation.services import rollups, secret_answers
from delegation.services.base import lock_run, store_server_event
from delegation.services.identity import Connection
from delegation.services.lifecycle import mark_finished
from delegation.services.locks import retry_conflicts
from delegation.wire import canonical


@retry_conflicts
def command_answered(conn: Connection, command_pk: int, result=None, error=None) -> None:
    """A runner answered a server request: store the answer, then act on it by method."""
    with transaction.atomic(), rollups.batch():
        # Under the runner's row lock (as register takes it): a connection a newer register
        # replaced, or a revoked runner's, is fenced even before its socket hears so; its
        # answers change nothing and the command goes out again to the next valid connection.
        current = (
            Runner.objects.select_for_update(no_key=True)
            .filter(
                pk=conn.runner_pk, connection_generation=conn.generation, revoked_at__isnull=True
            )
            .values_list("pk", flat=True)
            .first()
        )
        if current is None:
            return
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
        handler = ANSWER_HANDLERS.get(command.method)
        if handler is not None:
            handler(command, result, error)


def _execute_answered(command: Command, result, error) -> None:
    """A refused child.execute fails the child: nothing else would ever run it."""
    if error is None or not command.run_id:
        return
    run = lock_run(command.run_id)
    if not run.is_terminal:
        message = error.get("message", "") if isinstance(error, dict) else str(error)
        mark_finished(run, RunStatus.FAILED, error=f"runner refused {command.method}: {message}")


def _steer_answered(command: Command, result, error) -> None:
    """A steer the runner did not inject (the turn ended first, say) reached nobody: say so on
    its receipt, its audit entry and the run's stream, where whoever steered will look."""
    if command.steer_id is None:
        return
    if error is not None:
        outcome = "error"
        reason = error.get("message", "") if isinstance(error, dict) else str(error)
    elif isinstance(result, dict) and result.get("outcome") == "injected":
        return
    else:
        outcome = result.get("outcome") if isinstance(result, dict) else None
        outcome = outcome if isinstance(outcome, str) and outcome else "unknown"
        reason = result.get("reason", "") if isinstance(result, dict) else ""
        reason = reason if isinstance(reason, str) else canonical(reason)
    run = lock_run(command.run_id)
    receipt = SteerReceipt.objects.select_for_update().get(pk=command.steer_id)
    if receipt.undelivered_at is not None:
        return
    receipt.undelivered_at = timezone.now()
    receipt.runner_outcome = outcome[:32]
    receipt.runner_reason = reason
    receipt.save(update_fields=["undelivered_at", "runner_outcome", "runner_reason"])
    why = f"{outcome} ({reason})" if reason else outcome
    store_server_event(
        run,
        "steer-undelivered",
        actor=f"runner:{run.runner.name}",
        text=f"steer {receipt.request_id} was not delivered: {why}",
        error=why,
        data={"requestId": receipt.request_id, "outcome": outcome, "reason": reason},
    )
    if receipt.audit_entry_id is not None:
        AuditEntry.objects.filter(pk=receipt.audit_entry_id).update(
            outcome=f"undelivered: {outcome}"[:64]
        )


# method -> what its answer changes; the answer itself is stored on the command either way.
ANSWER_HANDLERS = {
    Command.Method.CHILD_EXECUTE: _execute_answered,
    Command.Method.RUN_EXECUTE: _execute_answered,
    Command.Method.RUN_STEER: _steer_answered,
    Command.Method.APPROVAL_DECIDED: secret_answers.forget_delivered_answer,
}

"""An extension's question marked ``secret`` (kodelet's ``ui.input`` with ``secret: true``,
SPEC §15): the operator's answer reaches the extension and is stored nowhere a person reads.

The approval, its ``approval-decided`` event and the audit entry keep ``SECRET_ANSWER`` in its
place. The ``approval.decided`` command must carry the answer itself to the runner, and the
outbox keeps it only until the runner has answered that command (it is resent across
reconnects until then): then the command's copy is replaced too. A command never answered
(its run lost first) keeps it until retention deletes the run.
"""

from __future__ import annotations

from delegation.models import Approval, Command

SECRET_ANSWER = "(secret)"


def is_secret_question(approval: Approval) -> bool:
    return (
        approval.kind == "question"
        and isinstance(approval.input, dict)
        and approval.input.get("secret") is True
    )


def stored_message(approval: Approval, message: str) -> str:
    """What the records keep of a decision's message: a secret answer's stand-in, else it."""
    return SECRET_ANSWER if message and is_secret_question(approval) else message


def forget_delivered_answer(command: Command, _result, _error) -> None:
    """The runner answered ``approval.decided``: a secret answer leaves the outbox (the
    command is never sent again once answered, so nothing needs it any more)."""
    params = command.params if isinstance(command.params, dict) else {}
    if not params.get("message") or params["message"] == SECRET_ANSWER:
        return
    approval = (
        Approval.objects.filter(approval_id=params.get("approvalId"), run_id=command.run_id)
        .only("kind", "input")
        .first()
    )
    if approval is not None and is_secret_question(approval):
        command.params = {**params, "message": SECRET_ANSWER}
        command.save(update_fields=["params"])

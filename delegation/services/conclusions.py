"""Conclusions (SPEC §9): a run's structured account of what it achieved, stored on the run.

Two doors, one rule: the MCP ``conclude`` tool (``conclude``) and a ``canopy-conclusion``
block ending a ``result`` event's text (``conclude_from_output``, called where that event
sets the run's output, so every format and engine gets it). Both validate with
``delegation.wire.conclusions``; a bad block is an ``error`` event naming the field and the
run's plain output stands.
"""

from __future__ import annotations

from django.db import transaction

from delegation.errors import PARENT_NOT_RUNNING, RpcError
from delegation.models import Run, RunStatus
from delegation.services.audit import audit
from delegation.services.base import store_server_event
from delegation.services.identity import Caller
from delegation.services.locks import lock_run, retry_conflicts
from delegation.wire.conclusions import conclusion_of_output, parse_conclusion


def do_store_conclusion(run: Run, conclusion: dict, *, actor: str, source: str) -> None:
    """Store a validated conclusion and a ``conclusion`` event; ``run`` is held locked.

    A later conclusion replaces an earlier one: the last word of the run is what it achieved.
    """
    run.conclusion = conclusion
    run.save(update_fields=["conclusion"])
    store_server_event(
        run,
        "conclusion",
        actor=actor,
        text=conclusion["summary"],
        input=conclusion,
        data={"source": source},
    )


def conclude_from_output(run: Run, output: str, *, actor: str) -> None:
    """The ``canopy-conclusion`` block ending a result's text, if any; ``run`` held locked."""
    conclusion, problem = conclusion_of_output(output)
    if conclusion is not None:
        do_store_conclusion(run, conclusion, actor=actor, source="output")
    elif problem is not None:
        store_server_event(
            run,
            "error",
            actor=actor,
            error=f"invalid conclusion, output kept as it is: {problem}",
            data={"field": problem.split(":", 1)[0], "source": "output"},
        )


def check_conclusion(raw: dict) -> dict:
    """The ``conclude`` arguments, validated: −32602 naming the field."""
    return parse_conclusion(raw, prefix="arguments")


@retry_conflicts
def conclude(caller: Caller, *, run_pk: int, raw: dict) -> dict:
    """The MCP ``conclude`` tool: the caller's own running run states its conclusion."""
    conclusion = check_conclusion(raw)
    with transaction.atomic():
        run = lock_run(run_pk)
        if run.status != RunStatus.RUNNING:
            raise RpcError(PARENT_NOT_RUNNING, f"runId: run {run.run_id!r} is {run.status}")
        actor = caller.actor(run.runner)
        do_store_conclusion(run, conclusion, actor=actor.label, source="conclude")
        audit(actor, "conclude", "run", run.run_id, conclusion["status"])
    return {}

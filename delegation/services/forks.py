"""Fork from here (SPEC §14, issue 37): an operator starts a new top-level run of a finished
run's preset that continues its agent's conversation at one of its steps, with a new message.

One path for REST, the run page and ``manage.py launch --fork-from``: it checks the role, that
the run's agent can fork and has a session, and that the step is one of the run's events; the
new run is launched like a relaunch (same runner, preset, working directory and budget) with
``forkedFrom`` stored on it and ``forkFrom {runId, sessionId, sequence, runnerIndex}`` in its
``run.execute``. Refusals that depend on the run's state (still live, no agent session, a step
it does not have) are −32011 (409): the same body may be fine another time. The runner maps the step's runner index to the agent's transcript entry; a step
before any runner event, or ``sequence`` omitted, forks from the end. Audited as a launch with
``forkedFrom`` in its detail (refusals included).
"""

from __future__ import annotations

from dataclasses import replace

from django.db import transaction

from delegation.errors import ADMISSION_REFUSED, INVALID_PARAMS, PRESET_STALE, RpcError
from delegation.models import Event, ExtensionPreset, Run
from delegation.services.audit import audit, require_operator
from delegation.services.identity import Actor
from delegation.services.launch import do_launch_run, relaunch_of


def check_fork(original: Run, sequence: int | None) -> dict:
    """``run.execute``'s ``forkFrom`` for a fork of ``original`` at ``sequence``, or RpcError
    naming what stands in the way."""
    if not original.is_terminal:
        raise RpcError(
            ADMISSION_REFUSED,
            f"runId: run {original.run_id} is {original.status}; fork a finished run "
            "(pause it, or cancel it, first)",
        )
    presets = ExtensionPreset.objects.filter(runner_id=original.runner_id, name=original.profile)
    if original.extension_id:
        presets = presets.filter(extension_id=original.extension_id)
    if not any(p.can_fork for p in presets):
        raise RpcError(PRESET_STALE, f"preset {original.profile} cannot fork")
    if not original.agent_session_id:
        raise RpcError(
            ADMISSION_REFUSED,
            f"runId: run {original.run_id} recorded no agent session (its agent never "
            "reported one), so there is nothing to fork",
        )
    runner_index = None
    if sequence is not None:
        if not 1 <= sequence <= original.last_sequence:
            raise RpcError(
                ADMISSION_REFUSED,
                f"sequence: run {original.run_id} has events 1 to {original.last_sequence}, "
                f"not {sequence}",
            )
        # The step's own runner event, or the last one before a server event (a steer).
        runner_index = (
            Event.objects.filter(run=original, sequence__lte=sequence, runner_index__isnull=False)
            .order_by("-sequence")
            .values_list("runner_index", flat=True)
            .first()
        )
        if runner_index is None:
            raise RpcError(
                ADMISSION_REFUSED,
                f"sequence: step {sequence} of run {original.run_id} comes before anything "
                "its agent said; fork from a later step",
            )
    return {
        "runId": original.run_id,
        "sessionId": original.agent_session_id,
        "sequence": sequence,
        "runnerIndex": runner_index,
    }


def do_fork_run(actor: Actor, original: Run, *, message: str, sequence: int | None = None):
    """Start the fork; answers the new run's ``Result`` (``forkedFrom`` on its detail)."""
    require_operator(actor, "fork", "run", original.run_id)
    if not isinstance(message, str) or not message.strip():
        refusal = RpcError(INVALID_PARAMS, "message: required, the new instruction to fork with")
    else:
        try:
            fork_from = check_fork(original, sequence)
            launch = relaunch_of(original, message=message)
        except RpcError as exc:
            refusal = exc
        else:
            launch = replace(launch, relaunched_from=None, fork=(original.pk, sequence, fork_from))
            return do_launch_run(actor, launch)
    with transaction.atomic():
        audit(
            actor,
            "fork",
            "run",
            original.run_id,
            f"refused: {refusal.message}"[:64],
            detail={"sequence": sequence, "reason": refusal.message},
        )
    raise refusal

"""Launch (SPEC §9): an operator starts a top-level run on a connected runner.

One path for the REST API, the dashboard's "New run" form and ``manage.py launch``: the
session and run are stored at depth 0 first, then ``run.execute`` goes out through the
outbox (stored before it is sent, resent until answered), and the launch is audited, refusals
included.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db import transaction

from delegation.errors import INVALID_PARAMS, NOT_REGISTERED, PRESET_STALE, RpcError
from delegation.models import Budget, Command, ExtensionPreset, Run, Runner, RunnerState, RunVia
from delegation.services import approvals, budgets, lifecycle
from delegation.services.audit import audit, require_operator
from delegation.services.identity import Actor
from delegation.services.locks import retry_conflicts
from delegation.wire import BudgetLimits, Request, parse_model


@dataclass(frozen=True)
class Launch:
    runner: str
    profile: str
    message: str
    extension_id: str | None = None
    cwd: str | None = None
    budget: BudgetLimits | None = None  # SPEC §10: bounds the whole tree from its start
    relaunched_from: int | None = None  # the pk of the run this one starts again (relaunch)
    approvals: dict | None = None  # SPEC §11: the run's approval policy {rules, default}
    # SPEC §14 fork from here: (the run forked, its step or None, run.execute's forkFrom).
    fork: tuple[int, int | None, dict] | None = None


def do_launch_run(actor: Actor, launch: Launch) -> dict:
    """Store a top-level run and send it to its runner; answers the run's ``Result``."""
    require_operator(actor, "launch", "runner", launch.runner)
    try:
        return _launch(actor, launch)
    except RpcError as refusal:
        # Audited in its own transaction: the launch itself rolled back.
        with transaction.atomic():
            audit(
                actor,
                "launch",
                "runner",
                launch.runner[:128],
                f"refused: {refusal.message}"[:64],
                detail={"profile": launch.profile, "reason": refusal.message},
            )
        raise


@retry_conflicts
def _launch(actor: Actor, launch: Launch) -> dict:
    with transaction.atomic():
        return _launch_locked(actor, launch)


def _launch_locked(actor: Actor, launch: Launch) -> dict:
    # Long for its audit and budget fields; the run itself is made by lifecycle.create_run.
    run_id = f"r-{uuid.uuid4().hex}"
    fields = {"requestId": run_id, "profile": launch.profile, "message": launch.message}
    if launch.cwd:
        fields["cwd"] = launch.cwd
    request = parse_model(Request, fields, "body")
    runner = Runner.objects.select_for_update(no_key=True).filter(name=launch.runner).first()
    if runner is None or runner.state == RunnerState.REVOKED:
        raise RpcError(NOT_REGISTERED, f"runner: no runner named {launch.runner!r}")
    if runner.state != RunnerState.CONNECTED:
        raise RpcError(
            NOT_REGISTERED,
            f"runner: {runner.name!r} is not connected; a launched run needs a connected runner",
        )
    presets = ExtensionPreset.objects.filter(runner=runner, name=request.profile)
    if launch.extension_id:
        presets = presets.filter(extension_id=launch.extension_id)
    presets = list(presets)
    if not presets:
        where = f" in extension {launch.extension_id!r}" if launch.extension_id else ""
        raise RpcError(
            PRESET_STALE,
            f"profile: runner {runner.name!r} has no preset {request.profile!r}{where}",
        )
    if len(presets) > 1:
        names = ", ".join(sorted(p.extension_id for p in presets))
        raise RpcError(
            INVALID_PARAMS,
            f"extensionId: required, preset {request.profile!r} is offered by {names}",
        )
    preset = presets[0]
    cwd = lifecycle.confined_cwd(runner, request.cwd, field="cwd")
    session = lifecycle.new_session(
        runner=runner, depth=0, extension_id=preset.extension_id, profile=preset.name
    )
    run = lifecycle.create_run(
        runner=runner,
        session=session,
        run_id=run_id,
        depth=0,
        extension_id=preset.extension_id,
        generation=preset.generation,
        profile=preset.name,
        request=request.wire(),
        preset=preset.frozen(),
        options=preset.options or {},
        cwd=cwd,
        via=RunVia.LAUNCH.value,
        relaunched_from_id=launch.relaunched_from,
        forked_from_id=launch.fork[0] if launch.fork else None,
        forked_from_sequence=launch.fork[1] if launch.fork else None,
    )
    if launch.budget is not None:
        budgets.launch_budget(run, launch.budget, actor)
    if launch.approvals is not None:
        approvals.store_policy(run, approvals.check_policy(launch.approvals), source="operator")
    elif preset.approvals is not None:
        # SPEC §11: the preset's policy, unless the operator launching gave one.
        approvals.store_policy(run, preset.approvals, source="preset")
    result = lifecycle.dispatch(
        run, method=Command.Method.RUN_EXECUTE, fork_from=launch.fork[2] if launch.fork else None
    )
    audit(
        actor,
        "launch",
        "run",
        run.run_id,
        "launched",
        detail={
            "runner": runner.name,
            "extensionId": preset.extension_id,
            "profile": preset.name,
            "message": launch.message[:500],
            "budget": launch.budget.wire() if launch.budget is not None else None,
            "relaunchedFrom": run.relaunched_from.run_id if run.relaunched_from_id else None,
            "forkedFrom": launch.fork[2] if launch.fork else None,
            "approvals": launch.approvals,
        },
    )
    return result


def relaunch_of(original: Run, *, message: str | None = None) -> Launch:
    """A launch that starts ``original`` again: its runner, preset, working directory and
    budget, and its message unless ``message`` replaces it (SPEC §9, issue 25)."""
    request = original.request if isinstance(original.request, dict) else {}
    if message is None or not message.strip():
        message = request.get("message") if isinstance(request.get("message"), str) else ""
    if not message.strip():
        raise RpcError(
            INVALID_PARAMS,
            f"message: run {original.run_id!r} recorded no message; give the task to run",
        )
    limits = budgets.budget_wire(Budget.objects.filter(run=original).first())
    budget = BudgetLimits.model_validate(limits["limits"]) if limits and limits["limits"] else None
    return Launch(
        runner=original.runner.name,
        profile=original.profile,
        message=message,
        extension_id=original.extension_id or None,
        cwd=request.get("cwd") or None,
        budget=budget,
        relaunched_from=original.pk,
    )


def do_relaunch_run(actor: Actor, original: Run, *, message: str | None = None) -> dict:
    """Start a new top-level run from ``original``'s preset and (edited) message, linked to
    it (``relaunchedFrom``); the same checks, audit and answer as a launch."""
    require_operator(actor, "launch", "run", original.run_id)
    return do_launch_run(actor, relaunch_of(original, message=message))

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
from django.utils import timezone

from delegation import notify
from delegation.errors import INVALID_PARAMS, NOT_REGISTERED, PRESET_STALE, RpcError
from delegation.models import (
    Command,
    ExtensionPreset,
    Run,
    Runner,
    RunVia,
    Session,
)
from delegation.selectors import RESULT_RELATED, snapshot
from delegation.services import budgets, rollups
from delegation.services.base import task_of
from delegation.services.children import IDENTITY_KEYS
from delegation.services.operator import Actor, audit, require_operator
from delegation.services.outbox import enqueue
from delegation.wire import BudgetLimits, Request, confine_cwd, parse_model


@dataclass(frozen=True)
class Launch:
    runner: str
    profile: str
    message: str
    extension_id: str | None = None
    cwd: str | None = None
    budget: BudgetLimits | None = None  # SPEC §10: bounds the whole tree from its start


def do_launch_run(actor: Actor, launch: Launch) -> dict:
    """Store a top-level run and send it to its runner; answers the run's ``Result``."""
    require_operator(actor, "launch", "runner", launch.runner)
    try:
        with transaction.atomic():
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


def _launch(actor: Actor, launch: Launch) -> dict:
    run_id = f"r-{uuid.uuid4().hex}"
    fields = {"requestId": run_id, "profile": launch.profile, "message": launch.message}
    if launch.cwd:
        fields["cwd"] = launch.cwd
    request = parse_model(Request, fields, "body")
    runner = Runner.objects.select_for_update().filter(name=launch.runner).first()
    if runner is None or runner.revoked_at is not None:
        raise RpcError(NOT_REGISTERED, f"runner: no runner named {launch.runner!r}")
    if not runner.connected:
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
    cwd = request.cwd or ""
    if cwd and runner.workspace:
        try:
            cwd = confine_cwd(cwd, runner.workspace)
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, f"cwd: {exc}") from None
    now = timezone.now()
    session = Session.objects.create(
        conversation_id=f"c-{uuid.uuid4().hex}",
        runner=runner,
        depth=0,
        extension_id=preset.extension_id,
        profile=preset.name,
        host_instance_id=runner.host_instance_id,
    )
    raw_request = request.wire()
    run = Run.objects.create(
        run_id=run_id,
        session=session,
        runner=runner,
        depth=0,
        extension_id=preset.extension_id,
        generation=preset.generation,
        profile=preset.name,
        host_instance_id=runner.host_instance_id,
        request=raw_request,
        task=task_of(raw_request),
        preset=preset.frozen(),
        options=preset.options or {},
        cwd=cwd,
        via=RunVia.LAUNCH.value,
        created_at=now,
        updated_at=now,
    )
    rollups.run_created(run)
    if launch.budget is not None:
        budgets.launch_budget(run, launch.budget, actor)
    run = Run.objects.select_related(*RESULT_RELATED).get(pk=run.pk)
    result = snapshot(run)
    execute = {
        "identity": {key: result[key] for key in IDENTITY_KEYS},
        "request": raw_request,
        "preset": preset.frozen(),
        "depth": 0,
    }
    enqueue(runner.pk, Command.Method.RUN_EXECUTE, execute, run=run)
    notify.run_changed(run, new_run=True)
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
        },
    )
    return result

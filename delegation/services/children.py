"""Children (SPEC §6): the caller's authority, start (caps, narrowing, resume), and the read,
cancel, steer and lease release of children a caller owns.

Typed on purpose: the runner socket (``delegation.rpc``) and the MCP server
(``delegation.mcp``) call these with a ``Caller`` and validated ``Params``; nothing here knows
about JSON-RPC framing or MCP.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from delegation import depth as depthlib
from delegation import notify
from delegation.errors import (
    ADMISSION_REFUSED,
    BUDGET_EXHAUSTED,
    DEPTH_LIMIT,
    INVALID_PARAMS,
    LEASE_GONE,
    NO_SUCH_RUN,
    NOT_OWNED,
    PARENT_NOT_RUNNING,
    PRESET_STALE,
    REQUEST_ID_REUSED,
    RpcError,
)
from delegation.models import (
    Command,
    ExtensionPreset,
    Lease,
    LeaseState,
    Run,
    Runner,
    RunStatus,
    RunVia,
    Session,
)
from delegation.selectors import RESULT_RELATED, events_after, snapshot
from delegation.services import budgets, rollups
from delegation.services.base import lock_run, store_server_event, task_of
from delegation.services.operator import (
    Actor,
    do_cancel_run,
    do_release_lease,
    do_steer_run,
)
from delegation.services.outbox import enqueue
from delegation.services.runners import Connection, current_runner
from delegation.wire import REASONING_EFFORTS, Params, Request, canonical, confine_cwd, parse_model


@dataclass(frozen=True)
class Caller:
    """Who calls a child method: a runner's connection, and how the call arrived.

    The runner socket builds one from its connection. The MCP server builds one from a run
    token: the run's runner on its current connection, ``via`` mcp, and the level the agent
    declared (header or ``_meta``), which may raise the run's recorded level, never lower it.
    """

    conn: Connection
    via: str = RunVia.RUNNER.value
    declared_depth: int | None = None

    def level_of(self, run: Run) -> int:
        if self.declared_depth is None:
            return run.depth
        return max(run.depth, self.declared_depth)


def _as_caller(caller: Caller | Connection) -> Caller:
    return caller if isinstance(caller, Caller) else Caller(conn=caller)


@dataclass
class Authority:
    runner: Runner
    parent: Run | None
    lease: Lease | None


def lease_of(runner: Runner, lease_id: str | None, lock: bool = False) -> Lease | None:
    if lease_id is None:
        return None
    leases = Lease.objects.select_for_update(of=("self",)) if lock else Lease.objects
    return leases.select_related("parent_run").filter(runner=runner, lease_id=lease_id).first()


def _check_lease_usable(lease: Lease, now) -> None:
    if lease.state != LeaseState.ACTIVE:
        raise RpcError(LEASE_GONE, f"leaseId: lease {lease.lease_id!r} was {lease.state}")
    if lease.expires_at <= now:
        raise RpcError(LEASE_GONE, f"leaseId: lease {lease.lease_id!r} expired")


def _child_authority(conn: Connection, params: Params, *, starting: bool) -> Authority:
    """The calling run (running, of this runner) or the live lease it names (SPEC §6)."""
    runner = current_runner(conn)
    now = timezone.now()
    lease = lease_of(runner, params.lease_id, lock=True)
    wrong_extension = NOT_OWNED
    if lease is not None:
        if lease.extension_id != params.extension_id:
            raise RpcError(NOT_OWNED, "leaseId: not held by this extension")
        if lease.generation != params.generation:
            raise RpcError(
                PRESET_STALE if starting else wrong_extension,
                f"generation: lease {lease.lease_id!r} is held by generation {lease.generation}",
            )
        _check_lease_usable(lease, now)
    parent = None
    if params.run_id is not None:
        parent = (
            Run.objects.select_related(*RESULT_RELATED)
            .filter(run_id=params.run_id, runner=runner)
            .first()
        )
        if parent is None:
            raise RpcError(NO_SUCH_RUN, f"runId: no run {params.run_id!r} of this runner")
        if parent.status != RunStatus.RUNNING and lease is None:
            raise RpcError(
                PARENT_NOT_RUNNING,
                f"runId: run {params.run_id!r} is {parent.status}; a finished run needs a live "
                "lease to manage its children",
            )
    elif lease is not None:
        parent = lease.parent_run
    elif params.lease_id is not None and not starting:
        raise RpcError(NOT_OWNED, "leaseId: no such lease held by this extension")
    else:
        raise RpcError(INVALID_PARAMS, "runId: required field missing")
    if params.lease_id is not None and lease is None and parent is not None and not starting:
        raise RpcError(NOT_OWNED, "leaseId: no such lease held by this extension")
    return Authority(runner=runner, parent=parent, lease=lease)


def _owned_child(caller: Caller, params: Params) -> tuple[Authority, Run]:
    """The child run a read, cancel or steer is about; −32003 for anything not owned."""
    params.require("extension_id", "generation", "child_id")
    auth = _child_authority(caller.conn, params, starting=False)
    extension = ExtensionPreset.objects.filter(
        runner=auth.runner, extension_id=params.extension_id
    ).values_list("generation", flat=True)
    if params.generation not in set(extension):
        raise RpcError(NOT_OWNED, "extensionId/generation: not a registered extension generation")
    not_owned = RpcError(NOT_OWNED, f"childId: {params.child_id!r} is not a child of the caller")
    session = Session.objects.filter(
        conversation_id=params.child_id, runner=auth.runner, parent__isnull=False
    ).first()
    if session is None:
        raise not_owned
    runs = list(session.runs.select_related(*RESULT_RELATED).order_by("created_at", "id"))
    owned = [
        r
        for r in runs
        if r.extension_id == params.extension_id
        and (
            (auth.lease is not None and r.lease_id == auth.lease.pk)
            # A lease alone owns only the children started under it, not its run's others.
            or (params.run_id is not None and r.parent_id == auth.parent.pk)
        )
    ]
    if not owned:
        raise not_owned
    if params.child_run_id is not None:
        chosen = next((r for r in runs if r.run_id == params.child_run_id), None)
        if chosen is None:
            raise RpcError(
                NOT_OWNED, f"childRunId: {params.child_run_id!r} is not a run of that child"
            )
        return auth, chosen
    if len(runs) > 1 and caller.via == RunVia.MCP.value:
        # An agent names a child by childId only (SPEC §9): it means the child's latest run.
        return auth, runs[-1]
    if len(runs) > 1:
        raise RpcError(
            INVALID_PARAMS,
            f"childRunId: required because child {params.child_id!r} has {len(runs)} runs",
        )
    return auth, runs[0]


# --- child.start --------------------------------------------------------------------------


_LIMITS = ("maxTokens", "weakModelMaxTokens", "thinkingBudgetTokens", "maxTurns")
_STICKY_TRUE = ("noTools", "noExtensions", "noSkills", "useWeakModel")
_LISTS = ("allowedTools", "allowedCommands")


def narrow_options(parent: dict, *layers: tuple[str, dict]) -> dict:
    """Apply option layers over the parent's; refuse any that widen it (SPEC §4)."""
    effective = dict(parent)
    for source, layer in layers:
        for key, value in layer.items():
            inherited = parent.get(key)
            where = f"{source}.{key}"
            if key in _LIMITS and inherited is not None and value > inherited:
                raise RpcError(
                    INVALID_PARAMS,
                    f"{where}: {value} exceeds the parent's {inherited} (a child may only narrow)",
                )
            if key in _STICKY_TRUE and inherited is True and value is False:
                raise RpcError(
                    INVALID_PARAMS, f"{where}: cannot switch off the parent's {key} (only narrow)"
                )
            if key == "enableFSSearchTools" and inherited is False and value is True:
                raise RpcError(
                    INVALID_PARAMS, f"{where}: the parent disabled FS search tools (only narrow)"
                )
            if key in _LISTS and inherited is not None:
                outside = [item for item in value if item not in inherited]
                if outside:
                    raise RpcError(
                        INVALID_PARAMS,
                        f"{where}: {outside} not in the parent's list (a child may only narrow)",
                    )
            if key == "reasoningEffort" and inherited is not None:
                if REASONING_EFFORTS.index(value) > REASONING_EFFORTS.index(inherited):
                    raise RpcError(
                        INVALID_PARAMS,
                        f"{where}: {value!r} is above the parent's {inherited!r} (only narrow)",
                    )
            effective[key] = value
    return effective


def _fingerprint(request: dict, params: Params) -> str:
    material = canonical(
        {
            "request": request,
            "extensionId": params.extension_id,
            "toolCallId": params.tool_call_id,
            "leaseId": params.lease_id,
        }
    )
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


@dataclass
class _Refusal:
    error: RpcError


def start_child(caller: Caller | Connection, params: Params) -> dict:
    """Admit a child under the caller's run or lease and queue its child.execute."""
    outcome = _child_start(_as_caller(caller), params)
    if isinstance(outcome, _Refusal):
        # Committed: the refusal's event is on the parent's stream for the dashboard.
        raise outcome.error
    return outcome


def _child_start(caller: Caller, params: Params):
    try:
        with transaction.atomic(), rollups.batch():
            return _child_start_locked(caller, params)
    except IntegrityError:
        # Two identical child.start calls raced past the idempotency check on a backend
        # without a parent-row lock; the winner is stored, so answer as a replay.
        with transaction.atomic(), rollups.batch():
            return _child_start_locked(caller, params)


def _child_start_locked(caller: Caller, params: Params):
    auth = _child_authority(caller.conn, params, starting=True)
    runner, parent, lease = auth.runner, auth.parent, auth.lease
    if parent is None:
        raise RpcError(NO_SUCH_RUN, "runId: the lease has no parent run")
    # Serialise child.start under one parent: idempotency, caps and sequences need it.
    parent = lock_run(parent.pk)
    request = parse_model(Request, params.request, "request")
    raw_request = request.wire()
    preset = ExtensionPreset.objects.filter(
        runner=runner, extension_id=params.extension_id, name=request.profile
    ).first()
    if preset is None or preset.generation != params.generation:
        raise RpcError(
            PRESET_STALE,
            f"execution preset absent or stale: {params.extension_id}/{request.profile} "
            f"generation {params.generation}",
        )
    if request.lease_id != params.lease_id:
        raise RpcError(
            INVALID_PARAMS,
            f"request.leaseId: {request.lease_id!r} must equal leaseId {params.lease_id!r}",
        )
    fingerprint = _fingerprint(raw_request, params)
    previous = (
        Run.objects.select_related(*RESULT_RELATED)
        .filter(parent=parent, request_id=request.request_id)
        .first()
    )
    if previous is not None:
        if previous.request_fingerprint != fingerprint:
            raise RpcError(
                REQUEST_ID_REUSED,
                f"request.requestId: {request.request_id!r} was already used under this parent "
                "with different input",
            )
        return snapshot(previous)
    max_depth = settings.DELEGATION_MAX_DEPTH
    level = caller.level_of(parent)
    if not depthlib.may_spawn(level, max_depth):
        message = depthlib.refusal_message(level, max_depth)
        store_server_event(
            parent,
            "delegation-refused",
            actor=f"{caller.via}:{runner.name}",
            text=message,
            error=message,
            tool_call_id=params.tool_call_id,
            data={"requestId": request.request_id, "profile": request.profile},
        )
        parent.refused_spawns += 1
        parent.save(update_fields=["refused_spawns"])
        return _Refusal(RpcError(DEPTH_LIMIT, message))
    scope = (
        Run.objects.filter(lease=lease) if lease is not None else Run.objects.filter(parent=parent)
    )
    if scope.count() >= settings.DELEGATION_MAX_CHILDREN:
        raise RpcError(
            ADMISSION_REFUSED,
            f"admission refused: at most {settings.DELEGATION_MAX_CHILDREN} children per parent "
            "run or lease",
        )
    running = Run.objects.filter(parent=parent).live().count()
    if running >= settings.DELEGATION_MAX_CONCURRENT:
        raise RpcError(
            ADMISSION_REFUSED,
            f"admission refused: {running} children of this parent are still running (max "
            f"{settings.DELEGATION_MAX_CONCURRENT}); wait for one to finish",
        )
    session = _resumed_session(runner, parent, params, request) if request.resume else None
    request_options = request.options.wire() if request.options is not None else {}
    budget = request_options.pop("budget", None)
    options = narrow_options(
        parent.options,
        ("preset.options", preset.options or {}),
        ("request.options", request_options),
    )
    exhausted = budgets.admit_child(parent)
    if exhausted is not None:
        store_server_event(
            parent,
            "delegation-refused",
            actor=f"runner:{runner.name}",
            text=exhausted.message,
            error=exhausted.message,
            tool_call_id=params.tool_call_id,
            data={
                "requestId": request.request_id,
                "profile": request.profile,
                "code": BUDGET_EXHAUSTED,
                "budgetRunId": exhausted.budget_run_id,
                "limit": exhausted.limit,
            },
        )
        parent.refused_spawns += 1
        parent.save(update_fields=["refused_spawns"])
        return _Refusal(exhausted.error())
    cwd = request.cwd or ""
    if cwd and runner.workspace:
        try:
            cwd = confine_cwd(cwd, runner.workspace)
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, f"request.cwd: {exc}") from None
    now = timezone.now()
    if lease is None and params.lease_id is not None:
        lease = Lease.objects.create(
            runner=runner,
            lease_id=params.lease_id,
            extension_id=params.extension_id,
            generation=params.generation,
            parent_run=parent,
            expires_at=now + timedelta(seconds=settings.LEASE_TTL_SECONDS),
        )
    child_depth = depthlib.child_level(level)
    if session is None:
        session = Session.objects.create(
            conversation_id=f"c-{uuid.uuid4().hex}",
            runner=runner,
            depth=child_depth,
            parent=parent.session,
            extension_id=params.extension_id,
            profile=request.profile,
            host_instance_id=runner.host_instance_id,
        )
    child = Run.objects.create(
        run_id=f"r-{uuid.uuid4().hex}",
        session=session,
        runner=runner,
        parent=parent,
        root_id=parent.root_id or parent.pk,
        ancestry=rollups.chain_of(parent),
        # A resumed session keeps the level it was recorded at; never lower than parent + 1.
        depth=max(session.depth, child_depth),
        extension_id=params.extension_id,
        generation=params.generation,
        profile=request.profile,
        host_instance_id=runner.host_instance_id,
        tool_call_id=params.tool_call_id or "",
        lease=lease,
        request_id=request.request_id,
        request=raw_request,
        task=task_of(raw_request),
        request_fingerprint=fingerprint,
        preset=preset.frozen(),
        options=options,
        context_mode=request.mode,
        cwd=cwd,
        via=caller.via,
        created_at=now,
        updated_at=now,
    )
    rollups.run_created(child)
    if budget is not None:
        budgets.set_runner_budget(
            child, request.options.budget, "request.options.budget", f"runner:{runner.name}"
        )
    child = Run.objects.select_related(*RESULT_RELATED).get(pk=child.pk)
    result = snapshot(child)
    execute = {
        "identity": {key: result[key] for key in IDENTITY_KEYS},
        "request": raw_request,
        "preset": preset.frozen(),
        "depth": child.depth,
    }
    if lease is not None:
        execute["leaseId"] = lease.lease_id
    enqueue(runner.pk, Command.Method.CHILD_EXECUTE, execute, run=child)
    notify.run_changed(child, new_run=True)
    return result


IDENTITY_KEYS = (
    "runnerId",
    "hostInstanceId",
    "conversationId",
    "runId",
    "parentConversationId",
    "parentRunId",
    "extensionId",
    "profile",
)


def _resumed_session(runner: Runner, parent: Run, params: Params, request: Request) -> Session:
    """Only an earlier child of the same parent chain may be resumed, never any conversation."""
    # The same host instance too: a child's conversation lives with the process that ran it.
    session = Session.objects.filter(
        conversation_id=request.resume,
        runner=runner,
        host_instance_id=runner.host_instance_id,
        parent=parent.session,
        extension_id=params.extension_id,
        profile=request.profile,
    ).first()
    if session is None:
        raise RpcError(
            NOT_OWNED,
            f"request.resume: {request.resume!r} is not an earlier child of this parent with "
            f"profile {request.profile!r}",
        )
    if session.runs.live().exists():
        raise RpcError(
            ADMISSION_REFUSED,
            f"admission refused: child {request.resume!r} still has a run in progress",
        )
    return session


# --- child.read / cancel / steer / lease.release ------------------------------------------


def read_child(caller: Caller | Connection, params: Params) -> dict:
    with transaction.atomic():
        _auth, child = _owned_child(_as_caller(caller), params)
        events = events_after(child, params.after or 0, settings.CHILD_READ_PAGE)
        return snapshot(child, events)


def cancel_child(caller: Caller | Connection, params: Params) -> dict:
    caller = _as_caller(caller)
    with transaction.atomic():
        auth, child = _owned_child(caller, params)
        reason = "child.cancel" if caller.via == RunVia.RUNNER.value else "cancel_child (mcp)"
        do_cancel_run(Actor.for_runner(auth.runner, caller.via), child, reason=reason)
        return snapshot(lock_run(child.pk))


def steer_child(caller: Caller | Connection, params: Params) -> dict:
    caller = _as_caller(caller)
    with transaction.atomic():
        auth, child = _owned_child(caller, params)
        return do_steer_run(
            Actor.for_runner(auth.runner, caller.via),
            child,
            request_id=params.request_id,
            message=params.message,
        )


def release_child_lease(conn: Connection, params: Params) -> tuple[int, list[str]]:
    """Revoke the lease and cancel its children; the caller waits for them to finish."""
    with transaction.atomic():
        runner = current_runner(conn)
        lease = lease_of(runner, params.lease_id, lock=True)
        if lease is None:
            # A tombstone, so a late child.start cannot recreate what was released.
            lease = Lease.objects.create(
                runner=runner,
                lease_id=params.lease_id,
                extension_id=params.extension_id,
                generation=params.generation,
                state=LeaseState.TOMBSTONE,
                expires_at=timezone.now(),
                ended_at=timezone.now(),
            )
            return lease.pk, []
        if lease.extension_id != params.extension_id or lease.generation != params.generation:
            raise RpcError(
                NOT_OWNED, "leaseId: held by another extension or generation of this runner"
            )
        report = do_release_lease(Actor.for_runner(runner), lease)
        return lease.pk, report["pending"]

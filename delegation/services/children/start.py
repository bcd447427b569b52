"""``child.start`` (SPEC §6): caps, option narrowing, resume, replay, depth, admission and
budget checks, then the child run."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from delegation import depth as depthlib
from delegation.errors import (
    ADMISSION_REFUSED,
    BUDGET_EXHAUSTED,
    DEPTH_LIMIT,
    INVALID_PARAMS,
    NO_SUCH_RUN,
    NOT_OWNED,
    PRESET_STALE,
    REQUEST_ID_REUSED,
    RpcError,
)
from delegation.models import (
    Command,
    ExtensionPreset,
    Lease,
    Run,
    Runner,
    RunVia,
    Session,
)
from delegation.selectors import RESULT_RELATED, snapshot
from delegation.services import approvals, budgets, lifecycle, rollups
from delegation.services.base import lock_run, store_server_event
from delegation.services.children.authority import (
    child_authority,
)
from delegation.services.identity import Caller, Connection, as_caller
from delegation.services.locks import retry_conflicts
from delegation.wire import REASONING_EFFORTS, Params, Request, canonical, parse_model

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
    outcome = _child_start(as_caller(caller), params)
    if isinstance(outcome, _Refusal):
        # Committed: the refusal's event is on the parent's stream for the dashboard.
        raise outcome.error
    return outcome


@retry_conflicts
def _child_start(caller: Caller, params: Params):
    try:
        with transaction.atomic(), rollups.batch():
            return _child_start_locked(caller, params)
    except IntegrityError:
        # Two identical child.start calls raced past the idempotency check on a backend
        # without a parent-row lock; the winner is stored, so answer as a replay.
        with transaction.atomic(), rollups.batch():
            return _child_start_locked(caller, params)


@dataclass
class _Start:
    """What the checks of one child.start established, for the write step."""

    caller: Caller
    params: Params
    runner: Runner
    parent: Run
    lease: Lease | None
    request: Request
    preset: ExtensionPreset
    fingerprint: str
    level: int
    session: Session | None = None
    options: dict | None = None
    cwd: str = ""


def _child_start_locked(caller: Caller, params: Params):
    """SPEC §6's order: authority, request, preset, idempotency, depth, caps, then the write."""
    start = check_start_request(caller, params)
    previous = check_replay(start)
    if previous is not None:
        return snapshot(previous)
    refusal = check_depth(start)
    if refusal is not None:
        return refusal
    check_admission(start)
    if start.request.resume:
        start.session = check_resume(start)
    start.options = check_options(start)
    refusal = check_budget(start)
    if refusal is not None:
        return refusal
    start.cwd = lifecycle.confined_cwd(start.runner, start.request.cwd, field="request.cwd")
    return do_start_child(start)


def check_start_request(caller: Caller, params: Params) -> _Start:
    """Authority (locking the runner, then the parent run), the request and its preset."""
    auth = child_authority(caller.conn, params, starting=True)
    if auth.parent is None:
        raise RpcError(NO_SUCH_RUN, "runId: the lease has no parent run")
    # Serialise child.start under one parent: idempotency, caps and sequences need it.
    parent = lock_run(auth.parent.pk)
    request = parse_model(Request, params.request, "request")
    preset = ExtensionPreset.objects.filter(
        runner=auth.runner, extension_id=params.extension_id, name=request.profile
    ).first()
    if preset is None or preset.generation != params.generation:
        raise RpcError(
            PRESET_STALE,
            f"execution preset absent or stale: {params.extension_id}/{request.profile} "
            f"generation {params.generation}",
        )
    if request.mode == "fork" and not preset.can_fork:
        # SPEC §14: never a silent fresh start; refused before anything is stored.
        raise RpcError(PRESET_STALE, f"preset {request.profile} cannot fork")
    if request.lease_id != params.lease_id:
        raise RpcError(
            INVALID_PARAMS,
            f"request.leaseId: {request.lease_id!r} must equal leaseId {params.lease_id!r}",
        )
    return _Start(
        caller=caller,
        params=params,
        runner=auth.runner,
        parent=parent,
        lease=auth.lease,
        request=request,
        preset=preset,
        fingerprint=_fingerprint(request.wire(), params),
        level=caller.level_of(parent),
    )


def check_replay(start: _Start) -> Run | None:
    """The child an identical earlier call started; −32013 when the same id had other input."""
    previous = (
        Run.objects.select_related(*RESULT_RELATED)
        .filter(parent=start.parent, request_id=start.request.request_id)
        .first()
    )
    if previous is not None and previous.request_fingerprint != start.fingerprint:
        raise RpcError(
            REQUEST_ID_REUSED,
            f"request.requestId: {start.request.request_id!r} was already used under this "
            "parent with different input",
        )
    return previous


def check_depth(start: _Start) -> _Refusal | None:
    max_depth = settings.DELEGATION_MAX_DEPTH
    if depthlib.may_spawn(start.level, max_depth):
        return None
    message = depthlib.refusal_message(start.level, max_depth)
    return do_refuse_spawn(start, RpcError(DEPTH_LIMIT, message), data={})


def check_admission(start: _Start) -> None:
    """The caps of SPEC §6: children per parent run or lease, and live children per parent."""
    parent, lease = start.parent, start.lease
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


def check_resume(start: _Start) -> Session:
    """Only an earlier child of the same parent chain may be resumed, never any conversation."""
    request, runner = start.request, start.runner
    # The same host instance too: a child's conversation lives with the process that ran it.
    session = Session.objects.filter(
        conversation_id=request.resume,
        runner=runner,
        host_instance_id=runner.host_instance_id,
        parent=start.parent.session,
        extension_id=start.params.extension_id,
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


def check_options(start: _Start) -> dict:
    """The child's options: the parent's, narrowed by the preset's and then the request's."""
    request_options = start.request.options.wire() if start.request.options is not None else {}
    request_options.pop("budget", None)  # a budget is a limit on the subtree, not an option
    request_options.pop("approvals", None)  # a policy too (SPEC §11): strictest of the chain
    return narrow_options(
        start.parent.options,
        ("preset.options", start.preset.options or {}),
        ("request.options", request_options),
    )


def check_budget(start: _Start) -> _Refusal | None:
    exhausted = budgets.admit_child(start.parent)
    if exhausted is None:
        return None
    data = {
        "code": BUDGET_EXHAUSTED,
        "budgetRunId": exhausted.budget_run_id,
        "limit": exhausted.limit,
    }
    return do_refuse_spawn(start, exhausted.error(), data=data)


def do_refuse_spawn(start: _Start, error: RpcError, *, data: dict) -> _Refusal:
    """Record a refused spawn on the parent's stream (committed although the call fails)."""
    parent = start.parent
    store_server_event(
        parent,
        "delegation-refused",
        actor=start.caller.label(start.runner),
        text=error.message,
        error=error.message,
        tool_call_id=start.params.tool_call_id,
        data={"requestId": start.request.request_id, "profile": start.request.profile, **data},
    )
    parent.refused_spawns += 1
    parent.save(update_fields=["refused_spawns"])
    return _Refusal(error)


def do_start_child(start: _Start) -> dict:
    """The write step: the lease (on its first use), the session, the run, its budget, and
    its child.execute in the outbox, in one transaction."""
    runner, parent, params, request = start.runner, start.parent, start.params, start.request
    lease = start.lease
    if lease is None and params.lease_id is not None:
        lease = Lease.objects.create(
            runner=runner,
            lease_id=params.lease_id,
            extension_id=params.extension_id,
            generation=params.generation,
            parent_run=parent,
            expires_at=timezone.now() + timedelta(seconds=settings.LEASE_TTL_SECONDS),
        )
    child_depth = depthlib.child_level(start.level)
    session = start.session or lifecycle.new_session(
        runner=runner,
        depth=child_depth,
        parent=parent.session,
        extension_id=params.extension_id,
        profile=request.profile,
    )
    child = lifecycle.create_run(
        runner=runner,
        session=session,
        parent=parent,
        # A resumed session keeps the level it was recorded at; never lower than parent + 1.
        depth=max(session.depth, child_depth),
        extension_id=params.extension_id,
        generation=params.generation,
        profile=request.profile,
        tool_call_id=params.tool_call_id or "",
        lease=lease,
        request_id=request.request_id,
        request=request.wire(),
        request_fingerprint=start.fingerprint,
        preset=start.preset.frozen(),
        options=start.options,
        context_mode=request.mode,
        cwd=start.cwd,
        via=start.caller.via,
    )
    if request.options is not None and request.options.budget is not None:
        budgets.set_runner_budget(
            child, request.options.budget, "request.options.budget", start.caller.label(runner)
        )
    if request.options is not None and request.options.approvals is not None:
        # An agent's policy (through MCP) may only narrow; its allow rules count for nothing.
        source = "agent" if start.caller.via == RunVia.MCP.value else "runner"
        policy = approvals.check_policy(request.options.approvals, "request.options.approvals")
        approvals.store_policy(child, policy, source=source)
    elif start.preset.approvals is not None:
        approvals.store_policy(child, start.preset.approvals, source="preset")
    return lifecycle.dispatch(
        child,
        method=Command.Method.CHILD_EXECUTE,
        lease_id=lease.lease_id if lease is not None else None,
    )

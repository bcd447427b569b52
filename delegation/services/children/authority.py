"""Who may act on a child (SPEC §6): the calling run of this runner, or the live lease it
names; and which child run a read, cancel or steer is about (−32003 for anything not owned)."""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from delegation.errors import (
    INVALID_PARAMS,
    LEASE_GONE,
    NO_SUCH_RUN,
    NOT_OWNED,
    PARENT_NOT_RUNNING,
    PRESET_STALE,
    RpcError,
)
from delegation.models import (
    ExtensionPreset,
    Lease,
    LeaseState,
    Run,
    Runner,
    RunStatus,
    RunVia,
    Session,
)
from delegation.selectors import RESULT_RELATED
from delegation.services.identity import Caller, Connection
from delegation.services.runners import current_runner
from delegation.wire import Params


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


def check_lease_usable(lease: Lease, now) -> None:
    if lease.state != LeaseState.ACTIVE:
        raise RpcError(LEASE_GONE, f"leaseId: lease {lease.lease_id!r} was {lease.state}")
    if lease.expires_at <= now:
        raise RpcError(LEASE_GONE, f"leaseId: lease {lease.lease_id!r} expired")


def child_authority(conn: Connection, params: Params, *, starting: bool) -> Authority:
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
        check_lease_usable(lease, now)
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


def owned_child(
    caller: Caller, params: Params, checked: Authority | None = None
) -> tuple[Authority, Run]:
    """The child run a read, cancel or steer is about; −32003 for anything not owned.

    ``checked``: the caller's authority, already checked in this transaction for the same
    run, lease and extension (a join reads many children under one check)."""
    params.require("extension_id", "generation", "child_id")
    auth = checked or caller_authority(caller, params)
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
    # Only the caller's own runs of the child: another parent on the same conversation may
    # have resumed it, and that run is the other parent's alone (issue 21).
    if params.child_run_id is not None:
        chosen = next((r for r in owned if r.run_id == params.child_run_id), None)
        if chosen is None:
            raise RpcError(
                NOT_OWNED, f"childRunId: {params.child_run_id!r} is not a run of that child"
            )
        return auth, chosen
    if len(runs) > 1 and caller.via == RunVia.MCP.value:
        # An agent names a child by childId only (SPEC §9): its latest run of that child.
        return auth, owned[-1]
    if len(runs) > 1:
        raise RpcError(
            INVALID_PARAMS,
            f"childRunId: required because child {params.child_id!r} has {len(runs)} runs",
        )
    return auth, owned[0]


def caller_authority(caller: Caller, params: Params) -> Authority:
    auth = child_authority(caller.conn, params, starting=False)
    extension = ExtensionPreset.objects.filter(
        runner=auth.runner, extension_id=params.extension_id
    ).values_list("generation", flat=True)
    if params.generation not in set(extension):
        raise RpcError(NOT_OWNED, "extensionId/generation: not a registered extension generation")
    return auth

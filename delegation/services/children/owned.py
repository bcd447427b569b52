"""``child.read``, ``child.cancel``, ``child.steer`` and ``lease.release`` of children a caller owns."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from delegation.errors import (
    NOT_OWNED,
    RpcError,
)
from delegation.models import (
    Lease,
    LeaseState,
    RunVia,
)
from delegation.selectors import events_after, snapshot
from delegation.services.base import lock_run
from delegation.services.children.authority import (
    caller_authority,
    lease_of,
    owned_child,
)
from delegation.services.identity import Actor, Caller, Connection, as_caller
from delegation.services.locks import retry_conflicts
from delegation.services.run_actions import do_cancel_run, do_release_lease, do_steer_run
from delegation.services.runners import current_runner
from delegation.wire import Params


@retry_conflicts
def read_child(caller: Caller | Connection, params: Params) -> dict:
    with transaction.atomic():
        _auth, child = owned_child(as_caller(caller), params)
        events = events_after(child, params.after or 0, settings.CHILD_READ_PAGE)
        return snapshot(child, events)


@retry_conflicts
def read_children(caller: Caller | Connection, many: list[Params]) -> tuple[list[dict], list[int]]:
    """Each child's ``Result`` without events (``await_children``), by ``read_child``'s
    ownership rule; with the children's run pks, whose doorbells the join waits on.

    A child the caller does not own refuses the whole call (−32003) naming its place in the
    list, and answers nothing about the others."""
    caller = as_caller(caller)
    with transaction.atomic():
        results, run_pks = [], []
        # Every params names the same run, lease and extension: their authority is checked
        # once, and a refusal of it is the caller's, not a child's.
        many[0].require("extension_id", "generation")
        auth = caller_authority(caller, many[0])
        for index, params in enumerate(many):
            try:
                _auth, child = owned_child(caller, params, auth)
            except RpcError as error:
                if error.code != NOT_OWNED:
                    raise
                raise RpcError(NOT_OWNED, f"childIds[{index}]: {error.message}") from None
            results.append(snapshot(child))
            run_pks.append(child.pk)
        return results, run_pks


@retry_conflicts
def cancel_child(caller: Caller | Connection, params: Params) -> dict:
    caller = as_caller(caller)
    with transaction.atomic():
        auth, child = owned_child(caller, params)
        reason = "child.cancel" if caller.via == RunVia.RUNNER.value else "cancel_child (mcp)"
        do_cancel_run(caller.actor(auth.runner), child, reason=reason)
        return snapshot(lock_run(child.pk))


@retry_conflicts
def steer_child(caller: Caller | Connection, params: Params) -> dict:
    caller = as_caller(caller)
    with transaction.atomic():
        auth, child = owned_child(caller, params)
        return do_steer_run(
            caller.actor(auth.runner),
            child,
            request_id=params.request_id,
            message=params.message,
        )


@retry_conflicts
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

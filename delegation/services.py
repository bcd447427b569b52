"""Writes. One function per operation; every transport (runner socket, dashboard, admin, REST)
calls these, so a cancel is the same cancel wherever it comes from.

Runner-facing functions (``register``, ``open_run``, ``append_events``, ``child_start``, ...)
check the runner's authority and then, for cancel, steer and release, call the shared operator
actions ``do_cancel_run``, ``do_steer_run`` and ``do_release_lease``, which check permission and
write the audit entry.

Every function runs in one transaction. A refusal raises ``RpcError`` before anything is
written, so a refused call changes nothing a later call could observe, with one deliberate
exception: a depth refusal commits its ``delegation-refused`` event, then raises.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from delegation import depth as depthlib
from delegation import notify, roles
from delegation.errors import (
    ADMISSION_REFUSED,
    DEPTH_LIMIT,
    INVALID_PARAMS,
    LEASE_GONE,
    NO_SUCH_RUN,
    NOT_OWNED,
    NOT_REGISTERED,
    PARENT_NOT_RUNNING,
    PRESET_STALE,
    REQUEST_ID_REUSED,
    STALE_CONNECTION,
    PermissionRefused,
    RpcError,
)
from delegation.models import (
    ApiToken,
    AuditEntry,
    Command,
    Event,
    ExtensionPreset,
    Lease,
    LeaseState,
    Run,
    Runner,
    RunStatus,
    Session,
    SteerReceipt,
    hash_token,
    new_token,
)
from delegation.protocol import MAX_STEER_BYTES, SERVER_EVENT_KINDS
from delegation.selectors import (
    EVENT_FIELDS,
    RESULT_RELATED,
    events_after,
    live_event_row,
    snapshot,
)
from delegation.wire import (
    MAX_EVENT_FIELD_BYTES,
    REASONING_EFFORTS,
    Params,
    RegisterParams,
    Request,
    RunEventParams,
    RunFinishParams,
    RunOpenParams,
    ToolEndParams,
    canonical,
    confine_cwd,
    parse_model,
    truncate_utf8,
    utf8_len,
    valid_id,
)

log = logging.getLogger(__name__)

MAX_STEER_RECEIPTS = 128
RUNNER_LOST_ERROR = "runner lost"


# --- Who is calling -----------------------------------------------------------------------


@dataclass(frozen=True)
class Actor:
    """Who performs an action, for permission checks, event attribution and the audit log."""

    label: str
    via: str
    user: object | None = None
    runner_pk: int | None = None

    @classmethod
    def for_user(cls, user, via: str) -> Actor:
        return cls(label=f"user:{user.get_username()}", via=via, user=user)

    @classmethod
    def for_runner(cls, runner: Runner) -> Actor:
        return cls(label=f"runner:{runner.name}", via=AuditEntry.Via.RUNNER, runner_pk=runner.pk)

    @classmethod
    def system(cls, why: str = "system") -> Actor:
        return cls(label=why, via=AuditEntry.Via.SYSTEM)


@dataclass(frozen=True)
class Connection:
    """One authenticated runner socket, as the consumer knows it."""

    runner_pk: int
    generation: int = 0
    declared_depth: int | None = None
    channel_name: str = ""


# --- Tokens -------------------------------------------------------------------------------


def create_runner(name: str) -> tuple[Runner, str]:
    """Create a runner, or rotate its token; the plain token is returned once and never kept."""
    valid_id(name, "runner name")
    token = new_token("cnr")
    runner, created = Runner.objects.get_or_create(
        name=name, defaults={"token_hash": hash_token(token), "token_prefix": token[:12]}
    )
    if not created:
        runner.token_hash = hash_token(token)
        runner.token_prefix = token[:12]
        runner.revoked_at = None
        runner.save(update_fields=["token_hash", "token_prefix", "revoked_at"])
    return runner, token


def revoke_runner(name: str) -> bool:
    return bool(
        Runner.objects.filter(name=name, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), token_hash=hash_token(new_token("revoked"))
        )
    )


def authenticate_runner(token: str) -> Runner | None:
    if not token:
        return None
    return Runner.objects.filter(token_hash=hash_token(token), revoked_at__isnull=True).first()


def create_api_token(user, name: str = "") -> tuple[ApiToken, str]:
    """A bearer token for scripts; it acts with its user's role. Shown once, stored hashed."""
    token = new_token("cna")
    api_token = ApiToken.objects.create(
        user=user, name=name, token_hash=hash_token(token), token_prefix=token[:12]
    )
    return api_token, token


def revoke_api_token(prefix: str) -> int:
    return ApiToken.objects.filter(token_prefix=prefix, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )


def authenticate_api_token(token: str):
    """The active user behind a bearer token, or None."""
    if not token:
        return None
    found = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=hash_token(token), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if found is None:
        return None
    now = timezone.now()
    # Refreshed at most once a minute: every API read would otherwise be a write.
    if found.last_used_at is None or now - found.last_used_at > timedelta(seconds=60):
        ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
    return found.user


# --- Internal helpers ---------------------------------------------------------------------


def _now():
    return timezone.now()


def _current_runner(conn: Connection, lock: bool = True) -> Runner:
    """The caller's runner, refusing frames from a fenced (older) connection."""
    runners = Runner.objects.select_for_update() if lock else Runner.objects
    runner = runners.get(pk=conn.runner_pk)
    if runner.revoked_at is not None:
        raise RpcError(STALE_CONNECTION, "runner token was revoked")
    if conn.generation == 0:
        raise RpcError(NOT_REGISTERED, "not registered: the first call must be runner.register")
    if runner.connection_generation != conn.generation:
        raise RpcError(
            STALE_CONNECTION,
            f"stale connection: generation {conn.generation} was replaced by "
            f"{runner.connection_generation}",
        )
    return runner


def _lock_run(pk: int) -> Run:
    # of=("self",): PostgreSQL cannot lock the nullable side of the outer joins.
    return Run.objects.select_for_update(of=("self",)).select_related(*RESULT_RELATED).get(pk=pk)


def _store_server_event(run: Run, kind: str, *, actor: str = "", **fields) -> Event:
    """Append one server event under the run's lock; the caller holds ``run`` locked."""
    run.last_sequence += 1
    event = Event.objects.create(
        run=run, sequence=run.last_sequence, kind=kind, actor=actor, **fields
    )
    run.updated_at = _now()
    run.save(update_fields=["last_sequence", "updated_at"])
    notify.run_changed(run)
    return event


def _enqueue(runner_pk: int, method: str, params: dict, run: Run | None = None) -> Command:
    command = Command.objects.create(runner_id=runner_pk, method=method, params=params, run=run)
    notify.runner_outbox(runner_pk)
    return command


def _audit(actor: Actor, action: str, target_type: str, target_id: str, outcome: str, **kw):
    return AuditEntry.objects.create(
        actor=actor.label,
        user=actor.user if actor.user is not None else None,
        via=actor.via,
        action=action,
        target_type=target_type,
        target_id=target_id,
        outcome=outcome,
        reason=kw.get("reason", ""),
        detail=kw.get("detail", {}),
    )


def _require_operator(actor: Actor, action: str, target_type: str, target_id: str, reason=""):
    """People need the operator role; runners were authorised by their own rules already."""
    if actor.user is None:
        return
    if roles.can_act(actor.user):
        return
    # The refusal is audited in its own transaction so it survives the caller's rollback.
    with transaction.atomic():
        _audit(actor, action, target_type, target_id, "refused: not an operator", reason=reason)
    raise PermissionRefused(
        f"{actor.label} has role {roles.role_of(actor.user) or 'none'}; {action} needs operator"
    )


def _finish(run: Run, status: str, *, error: str = "", output: str | None = None):
    run.status = status
    run.done = True
    run.cancelled = status == RunStatus.CANCELLED
    if error:
        run.error = error
    if output is not None:
        run.output = output
    run.finished_at = run.updated_at = _now()
    run.save(
        update_fields=[
            "status",
            "done",
            "cancelled",
            "error",
            "output",
            "finished_at",
            "updated_at",
        ]
    )
    notify.run_changed(run)


# --- runner.register ----------------------------------------------------------------------


def register(conn: Connection, raw_params) -> tuple[dict, int, str]:
    """Bump the generation (fencing every older connection) and replace the presets."""
    params = parse_model(RegisterParams, raw_params)
    with transaction.atomic():
        runner = Runner.objects.select_for_update().get(pk=conn.runner_pk)
        if runner.revoked_at is not None:
            raise RpcError(STALE_CONNECTION, "runner token was revoked")
        previous_channel = runner.channel_name
        previous_host = runner.host_instance_id
        runner.connection_generation += 1
        runner.channel_name = conn.channel_name
        runner.host_instance_id = params.host_instance_id
        runner.workspace = params.workspace or ""
        runner.declared_depth = conn.declared_depth
        runner.connected = True
        runner.last_seen_at = _now()
        runner.disconnected_at = None
        runner.lost_at = None
        runner.save()
        if previous_host and previous_host != params.host_instance_id:
            _abandon_host_instance(runner, previous_host, params.host_instance_id)
        ExtensionPreset.objects.filter(runner=runner).delete()
        ExtensionPreset.objects.bulk_create(
            ExtensionPreset(
                runner=runner,
                extension_id=ext.extension_id,
                generation=ext.generation,
                name=preset.name,
                options=preset.options.wire() if preset.options is not None else {},
                system_prompt=preset.system_prompt,
            )
            for ext in params.extensions
            for preset in ext.presets
        )
        # Everything not yet answered goes out again on this connection.
        Command.objects.filter(runner=runner, answered_at__isnull=True).update(sent_generation=None)
        notify.runner_changed(runner.pk)
    result = {"runnerId": runner.name, "connectionGeneration": runner.connection_generation}
    fenced = previous_channel if previous_channel != conn.channel_name else ""
    return result, runner.connection_generation, fenced


def _abandon_host_instance(runner: Runner, previous: str, current: str) -> None:
    """A new host instance means the old process is gone, with the runs it was executing.

    Without this, a runner restarted within the grace period would leave those runs
    "running" forever: it never counts as lost, and nothing is left to resend.
    """
    error = f"{RUNNER_LOST_ERROR}: host instance {previous} was replaced by {current}"
    pks = list(
        Run.objects.filter(runner=runner, host_instance_id=previous)
        .live()
        .values_list("pk", flat=True)
    )
    for pk in pks:
        _finish(_lock_run(pk), RunStatus.LOST, error=error)
    # Their commands would reach a process that never heard of them.
    Command.objects.filter(run_id__in=pks, answered_at__isnull=True).update(
        answered_at=_now(), result={"dropped": error}
    )


def runner_disconnected(conn: Connection) -> None:
    """Start the grace period, unless a newer connection already took over."""
    with transaction.atomic():
        updated = Runner.objects.filter(
            pk=conn.runner_pk, connection_generation=conn.generation, connected=True
        ).update(connected=False, disconnected_at=_now(), channel_name="")
        if updated:
            notify.runner_changed(conn.runner_pk)


def touch_runner(conn: Connection) -> None:
    Runner.objects.filter(pk=conn.runner_pk, connection_generation=conn.generation).update(
        last_seen_at=_now()
    )


# --- run.open / run.event / run.finish / tool.end ------------------------------------------


def open_run(conn: Connection, raw_params) -> dict:
    params = parse_model(RunOpenParams, raw_params)
    with transaction.atomic():
        runner = _current_runner(conn)
        existing = Run.objects.select_related(*RESULT_RELATED).filter(run_id=params.run_id).first()
        if existing is not None:
            # A replay after a reconnect answers with the run as stored.
            if existing.runner_id == runner.pk and (
                existing.session.conversation_id == params.conversation_id
            ):
                return snapshot(existing)
            raise RpcError(INVALID_PARAMS, f"runId: {params.run_id!r} is already in use")
        session = Session.objects.filter(conversation_id=params.conversation_id).first()
        if session is not None and (session.runner_id != runner.pk or session.parent_id):
            raise RpcError(
                NOT_OWNED,
                f"conversationId: {params.conversation_id!r} is not a top-level session of "
                "this runner (children are resumed through child.start)",
            )
        if session is None:
            level = depthlib.from_meta(params.meta or {})
            if level is None:
                level = runner.declared_depth if runner.declared_depth is not None else 0
            session = Session.objects.create(
                conversation_id=params.conversation_id,
                runner=runner,
                depth=level,
                extension_id=params.extension_id or "",
                profile=params.profile or "",
                host_instance_id=runner.host_instance_id,
            )
        options = {}
        if params.profile and params.extension_id:
            preset = ExtensionPreset.objects.filter(
                runner=runner, extension_id=params.extension_id, name=params.profile
            ).first()
            options = preset.options if preset else {}
        run = Run.objects.create(
            run_id=params.run_id,
            session=session,
            runner=runner,
            depth=session.depth,
            extension_id=params.extension_id or "",
            profile=params.profile or "",
            host_instance_id=runner.host_instance_id,
            options=options,
        )
        notify.run_changed(run, new_run=True)
        return snapshot(run)


def _normalise_event(event) -> dict:
    """The event as it will be stored: long fields cut at 32 KiB on a UTF-8 boundary."""
    row = {
        "kind": event.kind,
        "text": event.text,
        "tool_name": event.tool_name,
        "tool_call_id": event.tool_call_id,
        "input": event.input,
        "tool_output": event.tool_output,
        "success": event.success,
        "error": event.error,
        "truncated": False,
    }
    for name in ("text", "error", "input", "tool_output"):
        value = row[name]
        if value is None:
            continue
        if isinstance(value, str):
            row[name], cut = truncate_utf8(value, MAX_EVENT_FIELD_BYTES)
        elif not isinstance(value, bool | int | float):
            rendered = canonical(value)
            if utf8_len(rendered) > MAX_EVENT_FIELD_BYTES:
                row[name], cut = truncate_utf8(rendered, MAX_EVENT_FIELD_BYTES)
            else:
                cut = False
        else:
            cut = False
        row["truncated"] = row["truncated"] or cut
    return row


# A replay must repeat every field an event carries on the wire.
_COMPARED = ("kind", *(attr for _alias, attr in EVENT_FIELDS))


def _same_event(row: dict, stored: Event) -> bool:
    return all(canonical(row[name]) == canonical(getattr(stored, name)) for name in _COMPARED)


def append_events(conn: Connection, raw_params) -> dict:
    """Exactly-once append (SPEC §5): replays are skipped, conflicts and gaps refuse the frame."""
    params = parse_model(RunEventParams, raw_params)
    for index, event in enumerate(params.events):
        if event.kind in SERVER_EVENT_KINDS:
            raise RpcError(
                INVALID_PARAMS, f"events[{index}].kind: {event.kind!r} is reserved for the server"
            )
    rows = [_normalise_event(event) for event in params.events]
    with transaction.atomic():
        runner = _current_runner(conn, lock=False)
        run = Run.objects.select_for_update().filter(run_id=params.run_id, runner=runner).first()
        if run is None:
            raise RpcError(NO_SUCH_RUN, f"runId: no run {params.run_id!r} of this runner")
        first = params.from_
        if first > run.emitted + 1:
            raise RpcError(
                INVALID_PARAMS,
                f"from: {first} leaves a gap; the server has stored {run.emitted} events of "
                f"this run, resend from {run.emitted + 1}",
            )
        replayed = max(0, min(len(rows), run.emitted - first + 1))
        if replayed:
            stored = {
                e.runner_index: e
                for e in Event.objects.filter(
                    run=run, runner_index__gte=first, runner_index__lt=first + replayed
                )
            }
            for offset in range(replayed):
                match = stored.get(first + offset)
                if match is None or not _same_event(rows[offset], match):
                    raise RpcError(
                        INVALID_PARAMS,
                        f"events[{offset}]: conflicts with the stored event number "
                        f"{first + offset} of this run (a replay must repeat it exactly)",
                    )
        fresh = rows[replayed:]
        if fresh:
            now = _now()
            next_sequence = run.last_sequence
            next_index = run.emitted
            values = []
            for row in fresh:
                next_sequence += 1
                next_index += 1
                values.append((run.pk, next_sequence, next_index, now, row))
            _insert_events(values)
            fields = ["last_sequence", "emitted", "updated_at"]
            for event in params.events[replayed:]:
                # "A result event sets the run's output", kept whole (not truncated).
                if event.kind == "result" and event.text is not None:
                    run.output = event.text
                    if "output" not in fields:
                        fields.append("output")
            run.last_sequence = next_sequence
            run.emitted = next_index
            run.updated_at = now
            run.save(update_fields=fields)
            created_ms = int(now.timestamp() * 1000)
            first_sequence = next_sequence - len(fresh) + 1
            notify.run_changed(
                run,
                events=[
                    live_event_row(first_sequence + offset, row, created_ms)
                    for offset, row in enumerate(fresh)
                ],
            )
        return {"emitted": run.emitted, "sequence": run.last_sequence}


_EVENT_COLUMNS = (
    "run_id",
    "sequence",
    "runner_index",
    "created_at",
    "kind",
    "text",
    "tool_name",
    "tool_call_id",
    "input",
    "tool_output",
    "success",
    "error",
    "truncated",
    "actor",
)
_EVENT_JSON = ("input", "tool_output")
_PG_ARRAY_TYPES = (
    "bigint",
    "bigint",
    "bigint",
    "timestamptz",
    "text",
    "text",
    "text",
    "text",
    "jsonb",
    "jsonb",
    "boolean",
    "text",
    "boolean",
    "text",
)


def _insert_events(values: list[tuple]) -> None:
    """Insert runner events with as few statements as possible.

    The ORM's bulk_create spent most of an append preparing values field by field; this
    path is the hot one (ingest), so it prepares only what needs preparing: JSON and time.
    """
    quote = connection.ops.quote_name
    table = quote(Event._meta.db_table)
    columns = ", ".join(quote(name) for name in _EVENT_COLUMNS)
    placeholders = ", ".join(["%s"] * len(_EVENT_COLUMNS))
    json_field = {name: Event._meta.get_field(name) for name in _EVENT_JSON}
    created = Event._meta.get_field("created_at")
    rows = []
    stamps = {}
    for run_pk, sequence, runner_index, now, row in values:
        stamp = stamps.get(now)
        if stamp is None:
            stamp = stamps[now] = created.get_db_prep_save(now, connection)
        json_values = [
            None if row[name] is None else json_field[name].get_db_prep_save(row[name], connection)
            for name in _EVENT_JSON
        ]
        rows.append(
            (
                run_pk,
                sequence,
                runner_index,
                stamp,
                row["kind"],
                row["text"],
                row["tool_name"],
                row["tool_call_id"],
                json_values[0],
                json_values[1],
                row["success"],
                row["error"],
                row["truncated"],
                "",
            )
        )
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # One array per column: constant statement size, nothing for the client-side
            # binder to split, however many events the frame carries.
            casts = ", ".join(f"%s::{kind}[]" for kind in _PG_ARRAY_TYPES)
            cursor.execute(
                f"INSERT INTO {table} ({columns}) SELECT * FROM unnest({casts})",
                [list(column) for column in zip(*rows, strict=True)],
            )
            return
        # SQLite: a multi-row INSERT per chunk, under its bound-variable limit.
        for start in range(0, len(rows), _INSERT_CHUNK):
            chunk = rows[start : start + _INSERT_CHUNK]
            values_sql = ", ".join([f"({placeholders})"] * len(chunk))
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {values_sql}",
                [value for row in chunk for value in row],
            )


_INSERT_CHUNK = 500


def finish_run(conn: Connection, raw_params) -> dict:
    params = parse_model(RunFinishParams, raw_params)
    with transaction.atomic():
        runner = _current_runner(conn, lock=False)
        found = Run.objects.filter(run_id=params.run_id, runner=runner).values("pk").first()
        if found is None:
            raise RpcError(NO_SUCH_RUN, f"runId: no run {params.run_id!r} of this runner")
        run = _lock_run(found["pk"])
        if not run.is_terminal:
            if params.cancelled:
                status = RunStatus.CANCELLED
            elif params.error:
                status = RunStatus.FAILED
            else:
                status = RunStatus.SUCCEEDED
            _finish(run, status, error=params.error or "", output=params.output)
            _cancel_foreground_children(run, Run.objects.filter(parent=run), "parent run finished")
        return snapshot(run)


def end_tool(conn: Connection, raw_params) -> dict:
    params = parse_model(ToolEndParams, raw_params)
    with transaction.atomic():
        runner = _current_runner(conn, lock=False)
        run = Run.objects.filter(run_id=params.run_id, runner=runner).first()
        if run is None:
            raise RpcError(NO_SUCH_RUN, f"runId: no run {params.run_id!r} of this runner")
        children = Run.objects.filter(parent=run, tool_call_id=params.tool_call_id)
        cancelled = _cancel_foreground_children(run, children, "tool call ended")
        return {"cancelled": cancelled}


def _cancel_foreground_children(run: Run, children, reason: str) -> list[str]:
    """Foreground children (no lease) do not outlive the run or tool call that started them."""
    actor = Actor(label=f"runner:{run.runner.name}", via=AuditEntry.Via.SYSTEM)
    stopped = []
    for child in children.filter(lease__isnull=True).live():
        _request_cancel(actor, child, reason)
        stopped.append(child.run_id)
    return stopped


# --- Child authority ----------------------------------------------------------------------


@dataclass
class Authority:
    runner: Runner
    parent: Run | None
    lease: Lease | None


def _lease_of(runner: Runner, lease_id: str | None, lock: bool = False) -> Lease | None:
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
    runner = _current_runner(conn)
    now = _now()
    lease = _lease_of(runner, params.lease_id, lock=True)
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


def _owned_child(conn: Connection, params: Params) -> tuple[Authority, Run]:
    """The child run a read, cancel or steer is about; −32003 for anything not owned."""
    params.require("extension_id", "generation", "child_id")
    auth = _child_authority(conn, params, starting=False)
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


def child_start(conn: Connection, raw_params) -> dict:
    params = parse_model(Params, raw_params)
    params.require("extension_id", "generation", "request")
    outcome = _child_start(conn, params)
    if isinstance(outcome, _Refusal):
        # Committed: the refusal's event is on the parent's stream for the dashboard.
        raise outcome.error
    return outcome


def _child_start(conn: Connection, params: Params):
    try:
        with transaction.atomic():
            return _child_start_locked(conn, params)
    except IntegrityError:
        # Two identical child.start calls raced past the idempotency check on a backend
        # without a parent-row lock; the winner is stored, so answer as a replay.
        with transaction.atomic():
            return _child_start_locked(conn, params)


def _child_start_locked(conn: Connection, params: Params):
    auth = _child_authority(conn, params, starting=True)
    runner, parent, lease = auth.runner, auth.parent, auth.lease
    if parent is None:
        raise RpcError(NO_SUCH_RUN, "runId: the lease has no parent run")
    # Serialise child.start under one parent: idempotency, caps and sequences need it.
    parent = _lock_run(parent.pk)
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
    if not depthlib.may_spawn(parent.depth, max_depth):
        message = depthlib.refusal_message(parent.depth, max_depth)
        _store_server_event(
            parent,
            "delegation-refused",
            actor=f"runner:{runner.name}",
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
    options = narrow_options(
        parent.options,
        ("preset.options", preset.options or {}),
        ("request.options", (request.options.wire() if request.options is not None else {})),
    )
    cwd = request.cwd or ""
    if cwd and runner.workspace:
        try:
            cwd = confine_cwd(cwd, runner.workspace)
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, f"request.cwd: {exc}") from None
    now = _now()
    if lease is None and params.lease_id is not None:
        lease = Lease.objects.create(
            runner=runner,
            lease_id=params.lease_id,
            extension_id=params.extension_id,
            generation=params.generation,
            parent_run=parent,
            expires_at=now + timedelta(seconds=settings.LEASE_TTL_SECONDS),
        )
    child_depth = depthlib.child_level(parent.depth)
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
        request_fingerprint=fingerprint,
        preset=preset.frozen(),
        options=options,
        context_mode=request.mode,
        cwd=cwd,
        created_at=now,
        updated_at=now,
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
    _enqueue(runner.pk, Command.Method.CHILD_EXECUTE, execute, run=child)
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


def child_read(conn: Connection, raw_params) -> dict:
    params = parse_model(Params, raw_params)
    with transaction.atomic():
        _auth, child = _owned_child(conn, params)
        events = events_after(child, params.after or 0, settings.CHILD_READ_PAGE)
        return snapshot(child, events)


def child_cancel(conn: Connection, raw_params) -> dict:
    params = parse_model(Params, raw_params)
    with transaction.atomic():
        auth, child = _owned_child(conn, params)
        do_cancel_run(Actor.for_runner(auth.runner), child, reason="child.cancel")
        return snapshot(_lock_run(child.pk))


def child_steer(conn: Connection, raw_params) -> dict:
    params = parse_model(Params, raw_params)
    params.require("message", "request_id")
    with transaction.atomic():
        auth, child = _owned_child(conn, params)
        return do_steer_run(
            Actor.for_runner(auth.runner),
            child,
            request_id=params.request_id,
            message=params.message,
        )


def child_lease_release(conn: Connection, raw_params) -> tuple[int, list[str]]:
    """Revoke the lease and cancel its children; the caller waits for them to finish."""
    params = parse_model(Params, raw_params)
    params.require("lease_id", "extension_id", "generation")
    with transaction.atomic():
        runner = _current_runner(conn)
        lease = _lease_of(runner, params.lease_id, lock=True)
        if lease is None:
            # A tombstone, so a late child.start cannot recreate what was released.
            lease = Lease.objects.create(
                runner=runner,
                lease_id=params.lease_id,
                extension_id=params.extension_id,
                generation=params.generation,
                state=LeaseState.TOMBSTONE,
                expires_at=_now(),
                ended_at=_now(),
            )
            return lease.pk, []
        if lease.extension_id != params.extension_id or lease.generation != params.generation:
            raise RpcError(
                NOT_OWNED, "leaseId: held by another extension or generation of this runner"
            )
        report = do_release_lease(Actor.for_runner(runner), lease)
        return lease.pk, report["pending"]


def lease_pending(lease_pk: int) -> list[str]:
    return list(Run.objects.filter(lease_id=lease_pk).live().values_list("run_id", flat=True))


# --- Operator actions: one code path for runner, dashboard, admin and REST -----------------


def _request_cancel(actor: Actor, run: Run, reason: str) -> str:
    """Record the request and tell the runner; the run stops when the runner confirms."""
    run = _lock_run(run.pk)
    if run.is_terminal:
        return "already-finished"
    if run.cancel_requested_at is not None:
        return "already-requested"
    run.cancel_requested_at = _now()
    run.cancel_reason = reason
    run.save(update_fields=["cancel_requested_at", "cancel_reason"])
    text = f"cancel requested by {actor.label}" + (f": {reason}" if reason else "")
    _store_server_event(run, "cancel-requested", actor=actor.label, text=text)
    _enqueue(
        run.runner_id,
        Command.Method.RUN_CANCEL,
        {"runId": run.run_id, "reason": reason or "cancelled"},
        run=run,
    )
    return "requested"


def do_cancel_run(actor: Actor, run: Run, *, reason: str = "", cascade: bool = False) -> dict:
    """Cancel a run, and with ``cascade`` every live descendant, reporting each one."""
    action = "cancel-subtree" if cascade else "cancel"
    _require_operator(actor, action, "run", run.run_id, reason)
    with transaction.atomic():
        outcome = _request_cancel(actor, run, reason)
        descendants = []
        if cascade:
            from delegation.selectors import live_descendants

            for descendant in live_descendants(run):
                descendants.append(
                    {
                        "runId": descendant.run_id,
                        "depth": descendant.depth,
                        "outcome": _request_cancel(actor, descendant, reason),
                    }
                )
        report = {"runId": run.run_id, "outcome": outcome, "descendants": descendants}
        _audit(actor, action, "run", run.run_id, outcome, reason=reason, detail=report)
        return report


def do_steer_run(actor: Actor, run: Run, *, request_id: str, message: str) -> dict:
    """Queue a message for a running run; idempotent per child session by requestId."""
    _require_operator(actor, "steer", "run", run.run_id)
    try:
        valid_id(request_id, "requestId")
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"requestId: {exc}") from None
    if message.strip() == "":
        raise RpcError(INVALID_PARAMS, "message: must not be blank")
    if utf8_len(message) > MAX_STEER_BYTES:
        raise RpcError(INVALID_PARAMS, f"message: must be at most {MAX_STEER_BYTES} bytes")
    with transaction.atomic():
        run = _lock_run(run.pk)
        session = run.session
        receipt = SteerReceipt.objects.filter(session=session, request_id=request_id).first()
        if receipt is not None:
            if receipt.message != message:
                raise RpcError(
                    REQUEST_ID_REUSED,
                    f"requestId: {request_id!r} was already used for this child with a "
                    "different message",
                )
            return _steer_answer(receipt.outcome, receipt.reason)
        if SteerReceipt.objects.filter(session=session).count() >= MAX_STEER_RECEIPTS:
            raise RpcError(
                ADMISSION_REFUSED,
                f"admission refused: at most {MAX_STEER_RECEIPTS} steer requests per child",
            )
        if run.status == RunStatus.RUNNING and run.cancel_requested_at is None:
            outcome, reason = "injected", ""
            _store_server_event(
                run,
                "steer",
                actor=actor.label,
                text=message,
                data={"requestId": request_id},
            )
            _enqueue(
                run.runner_id,
                Command.Method.RUN_STEER,
                {"runId": run.run_id, "requestId": request_id, "message": message},
                run=run,
            )
        else:
            outcome, reason = "promptRequired", "noRunningTurn"
        SteerReceipt.objects.create(
            session=session,
            run=run,
            request_id=request_id,
            message=message,
            outcome=outcome,
            reason=reason,
            actor=actor.label,
        )
        _audit(
            actor,
            "steer",
            "run",
            run.run_id,
            outcome,
            detail={"requestId": request_id, "message": message[:500], "reason": reason},
        )
        return _steer_answer(outcome, reason)


def _steer_answer(outcome: str, reason: str) -> dict:
    answer = {"outcome": outcome}
    if reason:
        answer["reason"] = reason
    return answer


def do_release_lease(actor: Actor, lease: Lease, *, state: str = LeaseState.RELEASED) -> dict:
    """Revoke a lease and cancel every child under it (SPEC §6 child.lease.release)."""
    _require_operator(actor, "release", "lease", lease.lease_id)
    with transaction.atomic():
        lease = (
            Lease.objects.select_for_update(of=("self",)).select_related("runner").get(pk=lease.pk)
        )
        first_time = lease.state == LeaseState.ACTIVE
        if first_time:
            lease.state = state
            lease.ended_at = _now()
            lease.save(update_fields=["state", "ended_at"])
            if lease.parent_run_id:
                parent = _lock_run(lease.parent_run_id)
                _store_server_event(
                    parent,
                    "lease-released",
                    actor=actor.label,
                    text=f"lease {lease.lease_id} {state} by {actor.label}",
                    data={"leaseId": lease.lease_id, "state": state},
                )
            if actor.runner_pk != lease.runner_id:
                _enqueue(lease.runner_id, Command.Method.LEASE_REVOKED, {"leaseId": lease.lease_id})
        reason = f"lease {lease.lease_id} {lease.state}"
        for child in Run.objects.filter(lease=lease).live():
            _request_cancel(actor, child, reason)
        pending = lease_pending(lease.pk)
        _audit(
            actor,
            "release",
            "lease",
            lease.lease_id,
            ("released" if first_time else "already-" + lease.state),
            detail={"runner": lease.runner.name, "pending": pending},
        )
        return {"done": not pending, "pending": pending, "state": lease.state}


# --- Server-to-runner commands ------------------------------------------------------------


def claim_commands(conn: Connection, limit: int = 100) -> list[Command]:
    """Commands this connection has not sent yet, marked as sent on its generation."""
    with transaction.atomic():
        runner = Runner.objects.filter(pk=conn.runner_pk).values("connection_generation").first()
        if runner is None or runner["connection_generation"] != conn.generation:
            return []
        commands = list(
            Command.objects.select_for_update()
            .filter(runner_id=conn.runner_pk, answered_at__isnull=True)
            .exclude(sent_generation=conn.generation)
            .order_by("id")[:limit]
        )
        now = _now()
        for command in commands:
            command.sent_generation = conn.generation
            command.sent_at = now
            command.attempts += 1
        Command.objects.bulk_update(commands, ["sent_generation", "sent_at", "attempts"])
        return commands


def command_answered(conn: Connection, command_pk: int, result=None, error=None) -> None:
    """A runner answered a server request; a refused child.execute fails the child."""
    with transaction.atomic():
        command = (
            Command.objects.select_for_update()
            .filter(pk=command_pk, runner_id=conn.runner_pk, answered_at__isnull=True)
            .first()
        )
        if command is None:
            return
        command.answered_at = _now()
        command.result = {"error": error} if error is not None else result
        command.save(update_fields=["answered_at", "result"])
        if error is not None and command.method == Command.Method.CHILD_EXECUTE and command.run_id:
            run = _lock_run(command.run_id)
            if not run.is_terminal:
                message = error.get("message", "") if isinstance(error, dict) else str(error)
                _finish(run, RunStatus.FAILED, error=f"runner refused child.execute: {message}")


# --- Background upkeep: lease expiry and runner loss ---------------------------------------


@dataclass
class SweepReport:
    expired_leases: list[str] = field(default_factory=list)
    lost_runners: list[str] = field(default_factory=list)


def sweep(now=None) -> SweepReport:
    """Expire leases past their TTL and mark runners lost after the grace period.

    Safe to run in every process at once: each step re-checks its row under a lock.
    """
    now = now or _now()
    report = SweepReport()
    system = Actor.system("system:lease-expiry")
    for pk in Lease.objects.filter(state=LeaseState.ACTIVE, expires_at__lte=now).values_list(
        "pk", flat=True
    ):
        with transaction.atomic():
            lease = Lease.objects.select_for_update().filter(pk=pk).first()
            if lease is None or lease.state != LeaseState.ACTIVE or lease.expires_at > now:
                continue
            do_release_lease(system, lease, state=LeaseState.EXPIRED)
            report.expired_leases.append(lease.lease_id)
    _disconnect_silent_runners()
    grace = timedelta(seconds=settings.RUNNER_GRACE_SECONDS)
    for pk in Runner.objects.filter(
        connected=False, lost_at__isnull=True, disconnected_at__lte=now - grace
    ).values_list("pk", flat=True):
        with transaction.atomic():
            runner = Runner.objects.select_for_update().filter(pk=pk).first()
            if runner is None or runner.connected or runner.lost_at is not None:
                continue
            _lose_runner(runner, now)
            report.lost_runners.append(runner.name)
    return report


def _disconnect_silent_runners() -> None:
    """A connection whose server process died never reports its close: every live runner
    socket touches ``last_seen_at`` each OUTBOX_RESEND_SECONDS, so one silent for several
    periods is treated as closed then, and the grace period starts from that moment.

    Wall-clock time, not the sweep's ``now``: this is about processes, not about leases.
    """
    silent_since = timezone.now() - timedelta(seconds=settings.RUNNER_SILENT_SECONDS)
    stale = Runner.objects.filter(connected=True, last_seen_at__lt=silent_since)
    for runner in stale.only("pk", "last_seen_at"):
        updated = Runner.objects.filter(
            pk=runner.pk, connected=True, last_seen_at=runner.last_seen_at
        ).update(connected=False, disconnected_at=runner.last_seen_at, channel_name="")
        if updated:
            log.warning(
                "runner %s silent since %s: treated as disconnected", runner.pk, runner.last_seen_at
            )
            notify.runner_changed(runner.pk)


def _lose_runner(runner: Runner, now) -> None:
    lost = Actor.system("system:runner-lost")
    runner.lost_at = now
    runner.save(update_fields=["lost_at"])
    for lease in Lease.objects.filter(runner=runner, state=LeaseState.ACTIVE):
        do_release_lease(lost, lease, state=LeaseState.REVOKED)
    for pk in Run.objects.filter(runner=runner).live().values_list("pk", flat=True):
        run = _lock_run(pk)
        _finish(run, RunStatus.LOST, error=RUNNER_LOST_ERROR)
    _audit(lost, "runner-lost", "runner", runner.name, "lost")
    notify.runner_changed(runner.pk)

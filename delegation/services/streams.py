"""A run's stream: open, append (exactly once, bulk insert), finish, and the end of a tool call."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from delegation import depth as depthlib
from delegation import metrics, notify
from delegation.errors import (
    INVALID_PARAMS,
    NO_SUCH_RUN,
    NOT_OWNED,
    PARENT_NOT_RUNNING,
    RpcError,
)
from delegation.models import AuditEntry, Event, ExtensionPreset, Run, RunStatus, Session
from delegation.protocol import SERVER_EVENT_KINDS
from delegation.selectors import EVENT_FIELDS, RESULT_RELATED, live_event_row, snapshot
from delegation.services import approvals, budgets, event_store, lifecycle, prices, rollups
from delegation.services.base import activity_of, lock_run
from delegation.services.conclusions import conclude_from_output
from delegation.services.identity import Actor, Connection
from delegation.services.lifecycle import mark_finished
from delegation.services.locks import retry_conflicts
from delegation.services.run_actions import request_cancel
from delegation.services.runners import check_fence, current_runner
from delegation.wire import (
    MAX_EVENT_FIELD_BYTES,
    RunEventParams,
    RunFinishParams,
    RunOpenParams,
    ToolEndParams,
    Usage,
    canonical,
    parse_model,
    truncate_utf8,
    utf8_len,
    valid_id,
)


@retry_conflicts
def open_run(conn: Connection, params: RunOpenParams) -> dict:
    # Long because run.open is idempotent: the replay branch answers from the stored run
    # under the same lock as the first open, which then creates it through lifecycle.
    with transaction.atomic():
        runner = current_runner(conn)
        existing = Run.objects.select_related(*RESULT_RELATED).filter(run_id=params.run_id).first()
        if existing is not None:
            # A replay after a reconnect answers with the run as stored.
            if existing.runner_id == runner.pk and (
                existing.session.conversation_id == params.conversation_id
            ):
                if params.budget is not None:
                    # A runner may narrow its run's budget again, never raise it.
                    existing = lock_run(existing.pk)
                    budgets.set_runner_budget(
                        existing, params.budget, "budget", f"runner:{runner.name}"
                    )
                return snapshot(existing)
            raise RpcError(INVALID_PARAMS, f"runId: {params.run_id!r} is already in use")
        session = Session.objects.filter(conversation_id=params.conversation_id).first()
        if session is not None and session.runner_id != runner.pk:
            # Exactly the answer for an id in use: another runner must not learn that this
            # conversation exists, nor that it belongs to someone else.
            raise RpcError(
                INVALID_PARAMS, f"conversationId: {params.conversation_id!r} is already in use"
            )
        if session is not None and session.parent_id:
            raise RpcError(
                NOT_OWNED,
                f"conversationId: {params.conversation_id!r} is not a top-level session of "
                "this runner (children are resumed through child.start)",
            )
        if session is None:
            level = depthlib.from_meta(params.meta or {})
            if level is None:
                level = runner.declared_depth if runner.declared_depth is not None else 0
            session = lifecycle.new_session(
                runner=runner,
                conversation_id=params.conversation_id,
                depth=level,
                extension_id=params.extension_id or "",
                profile=params.profile or "",
            )
        options = {}
        if params.profile and params.extension_id:
            preset = ExtensionPreset.objects.filter(
                runner=runner, extension_id=params.extension_id, name=params.profile
            ).first()
            options = preset.options if preset else {}
        run = lifecycle.create_run(
            runner=runner,
            session=session,
            run_id=params.run_id,
            depth=session.depth,
            extension_id=params.extension_id or "",
            profile=params.profile or "",
            options=options,
            # Its task, when the runner says what it opened the run for.
            request={"message": params.message}
            if params.message and params.message.strip()
            else None,
        )
        if params.budget is not None:
            budgets.set_runner_budget(run, params.budget, "budget", f"runner:{runner.name}")
        if params.approvals is not None:
            approvals.store_policy(run, approvals.check_policy(params.approvals), source="runner")
        # The runner executes its own run: nothing to dispatch, only the dashboards to tell.
        lifecycle.announce(run)
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
            if len(value) * 4 <= MAX_EVENT_FIELD_BYTES:
                continue  # four bytes a character at most: nothing to cut
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
    def value(name):
        found = getattr(stored, name)
        # A stored usage event carries what pricing added; the replay repeats what was sent.
        return prices.as_received(found) if name == "input" and stored.kind == "usage" else found

    return all(canonical(row[name]) == canonical(value(name)) for name in _COMPARED)


def append_event_frames_of(
    calls: list[tuple[Connection, list[RunEventParams]]],
) -> list[list[dict | RpcError]]:
    """Consecutive ``run.event`` frames of one or several connections, committed together
    (group commit); for each call, each frame's answer or RpcError, in order.

    Every ``run.event`` is stored here, a lone frame as a group of one. Exactly-once (SPEC
    §5): replays are skipped, conflicts and gaps refuse the frame; usage events add to the
    rollups in the same transaction, and a budget they bring to 80% or past a limit is acted
    on right after the commit (``budgets.enforce``). Each frame is checked, stored or refused
    as if alone, one after another: a refused frame is refused before it writes anything, so it changes nothing and
    the next sees the state before it. A frame carrying usage ends its transaction, so the
    rollup rows stay the last locks a transaction takes (the lock order in
    ``services.locks``)."""
    frames = [(index, conn, params) for index, (conn, own) in enumerate(calls) for params in own]
    outcomes: list[dict | RpcError] = []
    group: list[tuple[Connection, RunEventParams]] = []
    for _index, conn, params in frames:
        group.append((conn, params))
        if any(event.kind == "usage" for event in params.events):
            outcomes += _append_group(group)
            group = []
    if group:
        outcomes += _append_group(group)
    answers: list[list[dict | RpcError]] = [[] for _call in calls]
    for (index, _conn, _params), outcome in zip(frames, outcomes, strict=True):
        answers[index].append(outcome)
    return answers


def _prepare(params: RunEventParams) -> tuple[list[dict], dict[int, Usage]]:
    usages: dict[int, Usage] = {}
    for index, event in enumerate(params.events):
        if event.kind in SERVER_EVENT_KINDS:
            raise RpcError(
                INVALID_PARAMS, f"events[{index}].kind: {event.kind!r} is reserved for the server"
            )
        if event.kind == "usage":
            usages[index] = parse_model(Usage, event.input, f"events[{index}].input")
    return [_normalise_event(event) for event in params.events], usages


@retry_conflicts
def _append_group(group: list[tuple[Connection, RunEventParams]]) -> list[dict | RpcError]:
    outcomes: list[dict | RpcError] = []
    due: list[int] = []
    # One statement each for the group, not one a frame: the runs are locked together, the
    # events go in with one COPY and the runs' counters with one UPDATE a set of fields, at
    # the end; a replay check reads the stored events, so it has what is pending written
    # first.
    pending = _Pending()
    with transaction.atomic():
        locked = event_store.lock_own_runs(
            sorted({(conn.runner_pk, params.run_id) for conn, params in group})
        )
        for conn, params in group:
            try:
                rows, usages = _prepare(params)
                run, replayed = _check_append(
                    conn, params, rows, locked=locked, before_reading=pending.write
                )
            except RpcError as exc:
                outcomes.append(exc)
                continue
            answer, frame_due = _store_append(params, rows, usages, run, replayed, pending)
            outcomes.append(answer)
            due += frame_due
        pending.write()
    if due:
        budgets.enforce(due)
    return outcomes


class _Pending:
    """What a group commit has yet to write: event rows, and the fields of each run."""

    def __init__(self):
        self.events: list[tuple] = []
        self.runs: dict[int, tuple[Run, list[str]]] = {}

    def update(self, run: Run, names: list[str]) -> None:
        _run, fields = self.runs.setdefault(run.pk, (run, []))
        fields.extend(name for name in names if name not in fields)

    def write(self) -> None:
        if self.events:
            event_store.insert_events(self.events)
            self.events = []
        if self.runs:
            event_store.save_runs_fields(list(self.runs.values()))
            self.runs = {}


def _usage_totals(priced) -> dict[str, int]:
    totals = {"tokens_in": 0, "tokens_out": 0, "cache_read": 0, "cache_write": 0, "cost_nanos": 0}
    totals["unpriced"] = sum(1 for _usage, unpriced in priced if unpriced)
    for usage, _unpriced in priced:
        totals["tokens_in"] += usage.input_tokens
        totals["tokens_out"] += usage.output_tokens
        totals["cache_read"] += usage.cache_read_tokens
        totals["cache_write"] += usage.cache_write_tokens
        totals["cost_nanos"] += rollups.cost_nanos(usage.cost_usd)
    totals["events"] = len(priced)
    return totals


@retry_conflicts
def _check_append(
    conn: Connection, params: RunEventParams, rows, *, locked: dict, before_reading
) -> tuple[Run, int]:
    """The frame's run, locked, and how many of its events are replays; every refusal of a
    frame is raised here, before anything is written, so a frame refused in a group commit
    leaves the group's transaction as it found it (no savepoint needed)."""
    # Locked by the group: the run as the group's frames before this one left it.
    found = locked.get((conn.runner_pk, params.run_id))
    if found is None:
        current_runner(conn, lock=False)  # a fenced caller hears that first
        raise RpcError(NO_SUCH_RUN, f"runId: no run {params.run_id!r} of this runner")
    run, revoked, generation = found
    check_fence(conn, revoked, generation)
    first = params.from_
    if run.is_terminal and first + len(rows) - 1 > run.emitted:
        # A finished run's stream and output are final: only exact replays (checked
        # below) are still answered, so a late or hostile frame cannot rewrite it.
        raise RpcError(
            PARENT_NOT_RUNNING,
            f"runId: run {params.run_id!r} is {run.status}; it takes no new events "
            f"(it has {run.emitted}; only exact replays of those are accepted)",
        )
    if first > run.emitted + 1:
        raise RpcError(
            INVALID_PARAMS,
            f"from: {first} leaves a gap; the server has stored {run.emitted} events of "
            f"this run, resend from {run.emitted + 1}",
        )
    replayed = max(0, min(len(rows), run.emitted - first + 1))
    if replayed:
        before_reading()
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
    return run, replayed


def agent_session_of(event) -> str:
    """The agent's session id a ``session`` event carries (``input.sessionId``, as the
    engines report Claude Code's ``init``), when it is a ValidID; else ""."""
    if event.kind != "session" or not isinstance(event.input, dict):
        return ""
    value = event.input.get("sessionId")
    try:
        return valid_id(value, "sessionId") if isinstance(value, str) else ""
    except ValueError:
        return ""


def _store_append(
    params: RunEventParams, rows, usages, run: Run, replayed: int, pending: _Pending
) -> tuple[dict, list[int]]:
    """Store what ``_check_append`` let through (it refuses nothing: see there): the events
    and the run's fields are left in the group's ``pending`` for the group to write before
    its commit."""
    due: list[int] = []
    # Priced here, inside the transaction, from the table as it is now (SPEC §10).
    priced = prices.price_rows(rows, {i: u for i, u in usages.items() if i >= replayed})
    fresh = rows[replayed:]
    if fresh:
        now = timezone.now()
        next_sequence = run.last_sequence
        next_index = run.emitted
        values = []
        for row in fresh:
            next_sequence += 1
            next_index += 1
            values.append((run.pk, next_sequence, next_index, now, row))
        pending.events += values
        fields = ["last_sequence", "emitted", "updated_at"]
        for event in params.events[replayed:]:
            # "A result event sets the run's output", kept whole (not truncated).
            if event.kind == "result" and event.text is not None:
                run.output = event.text
                if "output" not in fields:
                    fields.append("output")
            session = agent_session_of(event)
            if session:
                # SPEC §14: the agent's session id, what a fork of this run resumes.
                run.agent_session_id = session
                if "agent_session_id" not in fields:
                    fields.append("agent_session_id")
        activity = activity_of(fresh)
        if activity is not None:
            run.activity = activity
            run.activity_at = now
            fields += ["activity", "activity_at"]
        run.last_sequence = next_sequence
        run.emitted = next_index
        run.updated_at = now
        pending.update(run, fields)
        if "output" in fields:
            # SPEC §9: a canopy-conclusion block ending the output is the run's conclusion.
            conclude_from_output(run, run.output, actor=f"runner:{run.runner.name}")
        fresh_usage = list(priced.values())
        if fresh_usage and rollups.enabled():
            budgeted = rollups.usage_added(run, _usage_totals(fresh_usage))
            if budgeted:
                due = budgets.budgets_to_check(budgeted)
        created_ms = int(now.timestamp() * 1000)
        first_sequence = next_sequence - len(fresh) + 1
        notify.run_changed(
            run,
            events=[
                live_event_row(first_sequence + offset, row, created_ms)
                for offset, row in enumerate(fresh)
            ],
        )
        # Counted once stored: in a group commit that is after the group's commit.
        stored = len(fresh)
        transaction.on_commit(lambda: metrics.events_stored(stored))
    return {"emitted": run.emitted, "sequence": run.last_sequence}, due


@retry_conflicts
def finish_run(conn: Connection, params: RunFinishParams) -> dict:
    with transaction.atomic(), rollups.batch():
        runner = current_runner(conn, lock=False)
        found = Run.objects.filter(run_id=params.run_id, runner=runner).values("pk").first()
        if found is None:
            raise RpcError(NO_SUCH_RUN, f"runId: no run {params.run_id!r} of this runner")
        run = lock_run(found["pk"])
        if not run.is_terminal:
            if params.cancelled:
                status = RunStatus.CANCELLED
            elif params.error:
                status = RunStatus.FAILED
            else:
                status = RunStatus.SUCCEEDED
            if params.output is not None and params.output != run.output:
                # An output given only here (no result event) may end with the block too.
                conclude_from_output(run, params.output, actor=f"runner:{runner.name}")
            mark_finished(run, status, error=params.error or "", output=params.output)
            _cancel_foreground_children(run, Run.objects.filter(parent=run), "parent run finished")
        return snapshot(run)


@retry_conflicts
def end_tool(conn: Connection, params: ToolEndParams) -> dict:
    with transaction.atomic():
        runner = current_runner(conn, lock=False)
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
        request_cancel(actor, child, reason)
        stopped.append(child.run_id)
    return stopped

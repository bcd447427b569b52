"""The live path's reads: what a server reads for each doorbell it takes (a run's state and its
events after a sequence), with their SQL compiled once (``compiled``).

They give exactly what ``run_state`` of the run and ``live_event`` of each event give, from
the models (``tests/operators/live/test_live_reads.py`` compares them on both backends).
"""

from __future__ import annotations

from delegation.models import Event, Run
from delegation.selectors.compiled import CompiledRead
from delegation.selectors.events import EVENT_FIELDS, live_event_row, millis

_STATE_COLUMNS = (
    "runner__name",
    "host_instance_id",
    "session__conversation_id",
    "session__parent__conversation_id",
    "run_id",
    "parent__run_id",
    "extension_id",
    "profile",
    "done",
    "cancelled",
    "error",
    "output",
    "depth",
    "status",
    "conclusion",
    "last_sequence",
    "created_at",
    "finished_at",
    "cancel_requested_at",
    "cancel_reason",
    "refused_spawns",
)
_EVENT_ATTRS = tuple(attr for _alias, attr in EVENT_FIELDS)
_EVENT_COLUMNS = ("sequence", "kind", *_EVENT_ATTRS, "truncated", "actor", "data", "created_at")

_state = CompiledRead(lambda pk: Run.objects.filter(pk=pk).values_list(*_STATE_COLUMNS))
_event_pages: dict[int, CompiledRead] = {}


def live_run_state(run_pk: int) -> dict | None:
    """``run_state`` of the run, or None when there is no such run."""
    rows = _state(run_pk)
    if not rows:
        return None
    (
        runner,
        host_instance_id,
        conversation_id,
        parent_conversation_id,
        run_id,
        parent_run_id,
        extension_id,
        profile,
        done,
        cancelled,
        error,
        output,
        depth,
        status,
        conclusion,
        last_sequence,
        created_at,
        finished_at,
        cancel_requested_at,
        cancel_reason,
        refused_spawns,
    ) = rows[0]
    return {
        "runnerId": runner,
        "hostInstanceId": host_instance_id,
        "conversationId": conversation_id,
        "runId": run_id,
        "parentConversationId": parent_conversation_id or "",
        "parentRunId": parent_run_id or "",
        "extensionId": extension_id,
        "profile": profile,
        "done": done,
        "cancelled": cancelled,
        "error": error,
        "output": output,
        "depth": depth,
        "status": status,
        "conclusion": conclusion,
        "lastSequence": last_sequence,
        "createdAt": millis(created_at),
        "finishedAt": millis(finished_at),
        "cancelRequestedAt": millis(cancel_requested_at),
        "cancelReason": cancel_reason,
        "refusedSpawns": refused_spawns,
    }


def live_events_page(run_pk: int, after: int, limit: int) -> list[dict]:
    """Up to ``limit`` events of the run after ``after``, in the live socket's shape."""
    read = _event_pages.get(limit)
    if read is None:
        read = _event_pages[limit] = CompiledRead(
            lambda pk, after: (
                Event.objects.filter(run_id=pk, sequence__gt=after)
                .order_by("sequence")
                .values_list(*_EVENT_COLUMNS)[:limit]
            )
        )
    events = []
    width = len(_EVENT_ATTRS)
    for row in read(run_pk, after):
        sequence, kind = row[0], row[1]
        values = dict(zip(_EVENT_ATTRS, row[2 : 2 + width], strict=True))
        truncated, actor, data, created_at = row[2 + width :]
        values.update(kind=kind, truncated=truncated)
        events.append(live_event_row(sequence, values, millis(created_at), actor, data))
    return events

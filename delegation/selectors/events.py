"""Reads of event streams: the wire shape, pages after a sequence, the export's keyset pages."""

from __future__ import annotations

from django.db.models import Q

from delegation.models import Event, Run

EVENT_FIELDS = (
    ("text", "text"),
    ("toolName", "tool_name"),
    ("toolCallId", "tool_call_id"),
    ("input", "input"),
    ("toolOutput", "tool_output"),
    ("success", "success"),
    ("error", "error"),
)

EXPORT_EVENT_COLUMNS = ("run_id", "sequence", "kind", *(attr for _alias, attr in EVENT_FIELDS))


def millis(value) -> int | None:
    return int(value.timestamp() * 1000) if value is not None else None


def event_wire(event: Event) -> dict:
    """An event as every reader sees it: sequence, kind, and the fields that are present."""
    wire = {"sequence": event.sequence, "kind": event.kind}
    for alias, attr in EVENT_FIELDS:
        value = getattr(event, attr)
        if value is not None:
            wire[alias] = value
    return wire


def live_event_row(sequence: int, row: dict, created_ms: int, actor: str = "", data=None) -> dict:
    """The live socket's shape of an event (SPEC fields plus who and when), from stored values."""
    wire = {"sequence": sequence, "kind": row["kind"]}
    for alias, attr in EVENT_FIELDS:
        value = row[attr]
        if value is not None:
            wire[alias] = value
    wire["truncated"] = row["truncated"]
    wire["actor"] = actor
    if data is not None:
        wire["data"] = data
    wire["createdAt"] = created_ms
    return wire


def live_event(event: Event) -> dict:
    """A stored event in the live socket's shape."""
    row = {attr: getattr(event, attr) for _alias, attr in EVENT_FIELDS}
    row.update(kind=event.kind, truncated=event.truncated)
    return live_event_row(event.sequence, row, millis(event.created_at), event.actor, event.data)


def events_after(run: Run, after: int = 0, limit: int | None = None, kinds=None):
    events = Event.objects.filter(run=run, sequence__gt=after).order_by("sequence")
    if kinds:
        events = events.filter(kind__in=kinds)
    if limit is not None:
        events = events[:limit]
    return list(events)


def event_export_page(run_pks, after: tuple[int, int], size: int) -> list[tuple]:
    """The next ``size`` events of ``run_pks`` after (run pk, sequence), as tuples.

    Keyset order on the (run, sequence) unique index, so each page is one index range scan and
    an export holds one page in memory at a time, however long the streams are.
    """
    run_pk, sequence = after
    events = Event.objects.filter(run_id__in=list(run_pks)).filter(
        Q(run_id__gt=run_pk) | Q(run_id=run_pk, sequence__gt=sequence)
    )
    return list(events.order_by("run_id", "sequence").values_list(*EXPORT_EVENT_COLUMNS)[:size])


def latest_event_input(run_pk: int, kind: str):
    """The ``input`` of the run's latest event of ``kind`` (None if it has none)."""
    return (
        Event.objects.filter(run_id=run_pk, kind=kind)
        .order_by("-sequence")
        .values_list("input", flat=True)
        .first()
    )


def run_pk_of(run_id: str) -> int | None:
    return Run.objects.filter(run_id=run_id).values_list("pk", flat=True).first()

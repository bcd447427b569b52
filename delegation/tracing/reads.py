"""What the spans of SPEC §12 are built from, read from the record as plain values: each run's
row (``RunRow``), its stream's tool calls and usage reports, and its pauses (SPEC §14).
``delegation.tracing.spans`` turns them into spans."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Q
from opentelemetry.sdk.trace import Event as SpanEvent

from delegation.models import TERMINAL_STATUSES, Event, Run

# The stream's kinds a span needs; text deltas and the rest are never read.
SPAN_KINDS = ("tool-use", "tool-result", "usage")


def nanos(moment) -> int:
    return int(moment.timestamp() * 1_000_000_000)


@dataclass
class ToolCall:
    call_id: str
    name: str
    started: object
    arguments: object = None
    ended: object = None
    success: bool | None = None
    result: object = None
    error: str | None = None


@dataclass
class Usage:
    sequence: int
    at: object
    data: dict


@dataclass
class RunRow:
    """What a run's span needs, read as plain values (no model instances: a batch of a
    thousand runs with five relations each is most of the export's time otherwise)."""

    pk: int
    run_id: str
    parent_id: int | None
    tool_call_id: str
    profile: str
    status: str
    depth: int
    via: str
    error: str
    output: str
    task: str
    request: object
    created_at: object
    finished_at: object
    conversation_id: str
    session_profile: str
    runner_name: str
    parent_run_id: str | None
    root_run_id: str | None
    tokens_in: int | None
    tokens_out: int | None
    cache_read: int | None
    cache_write: int | None
    cost_nanos: int | None
    paused_seconds: float | None = None  # SPEC §14: time paused (ended pauses)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


_ROW_FIELDS = {
    "pk": "pk",
    "run_id": "run_id",
    "parent_id": "parent_id",
    "tool_call_id": "tool_call_id",
    "profile": "profile",
    "status": "status",
    "depth": "depth",
    "via": "via",
    "error": "error",
    "output": "output",
    "task": "task",
    "request": "request",
    "created_at": "created_at",
    "finished_at": "finished_at",
    "conversation_id": "session__conversation_id",
    "session_profile": "session__profile",
    "runner_name": "runner__name",
    "parent_run_id": "parent__run_id",
    "root_run_id": "root__run_id",
    "tokens_in": "rollup__own_tokens_in",
    "tokens_out": "rollup__own_tokens_out",
    "cache_read": "rollup__own_cache_read",
    "cache_write": "rollup__own_cache_write",
    "cost_nanos": "rollup__own_cost_nanos",
    "paused_seconds": "paused_seconds",
}


def runs_for_export(run_pks) -> list[RunRow]:
    rows = (
        Run.objects.filter(pk__in=list(run_pks)).order_by("pk").values_list(*_ROW_FIELDS.values())
    )
    return [RunRow(*row) for row in rows]


def stream_of(runs):
    """Each run's tool calls and usage reports in stream order, and the model its latest
    usage named."""
    calls: dict[int, list[ToolCall]] = defaultdict(list)
    usages: dict[int, list[Usage]] = defaultdict(list)
    open_calls: dict[tuple[int, str], ToolCall] = {}
    models: dict[int, str] = {}
    rows = (
        Event.objects.filter(run_id__in=[run.pk for run in runs], kind__in=SPAN_KINDS)
        .order_by("run_id", "sequence")
        .values_list(
            "run_id",
            "sequence",
            "kind",
            "tool_name",
            "tool_call_id",
            "input",
            "tool_output",
            "success",
            "error",
            "created_at",
        )
        .iterator(chunk_size=2000)
    )
    for run_pk, sequence, kind, name, call_id, data, output, success, error, at in rows:
        if kind == "usage":
            if isinstance(data, dict):
                usages[run_pk].append(Usage(sequence, at, data))
                if isinstance(data.get("model"), str) and data["model"]:
                    models[run_pk] = data["model"]
            continue
        if not call_id:
            continue
        call = open_calls.get((run_pk, call_id))
        if kind == "tool-use":
            if call is None:
                call = ToolCall(call_id, name or "tool", at, arguments=data)
                open_calls[(run_pk, call_id)] = call
                calls[run_pk].append(call)
        elif call is not None and call.ended is None:
            call.ended, call.success, call.result, call.error = at, success, output, error
            if name and call.name == "tool":
                call.name = name
    return calls, models, usages


def parent_calls(runs) -> set[tuple[int, str]]:
    """(parent pk, toolCallId) pairs whose tool-use is in the parent's stream: only those
    children hang under a tool call's span (a span that exists), the rest under the run's."""
    wanted = {
        (run.parent_id, run.tool_call_id) for run in runs if run.parent_id and run.tool_call_id
    }
    if not wanted:
        return set()
    match = Q()
    for parent_pk, call_id in wanted:
        match |= Q(run_id=parent_pk, tool_call_id=call_id)
    found = Event.objects.filter(match, kind="tool-use").values_list("run_id", "tool_call_id")
    return set(found)


def pauses_of(runs) -> dict[int, list[SpanEvent]]:
    """SPEC §14: each run's pauses and resumes, as span events at the moment they happened."""
    out: dict[int, list[SpanEvent]] = defaultdict(list)
    rows = (
        Event.objects.filter(run_id__in=[run.pk for run in runs], kind__in=("paused", "resumed"))
        .order_by("run_id", "sequence")
        .values_list("run_id", "kind", "actor", "text", "created_at")
    )
    for run_pk, kind, actor, text, at in rows:
        attributes = {"canopy.actor": actor or "", "canopy.text": (text or "")[:500]}
        out[run_pk].append(SpanEvent(f"canopy.{kind}", attributes, nanos(at)))
    return out

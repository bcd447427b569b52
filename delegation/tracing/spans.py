"""SPEC §12's mapping from the record to OpenTelemetry spans (the SDK's ``ReadableSpan``).

A run is ``invoke_agent {profile}``; each tool call of its stream (a ``tool-use`` event and
its ``tool-result``) is ``execute_tool {toolName}`` under it; a child run started from a tool
call hangs under that call's span, otherwise under its parent run's span. Ids are hashes of
stored identities: the trace id of the root's runId, a run's span id of its runId, a tool
call's of (runId, toolCallId), so exporting again (or a run's final spans after its
open-run ones) gives the same ids and backends replace rather than duplicate.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Q
from django.utils import timezone
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from delegation.models import TERMINAL_STATUSES, Event, Run, RunStatus

SCOPE = InstrumentationScope("canopy", "1")
# Not (yet) in opentelemetry-semantic-conventions: the names SPEC §12 fixes.
COST_AMOUNT = "gen_ai.usage.cost.amount"
COST_CURRENCY = "gen_ai.usage.cost.currency"
# Phoenix's own key for its views (OpenInference), set beside the gen_ai ones.
OPENINFERENCE_KIND = "openinference.span.kind"
ERROR_STATUSES = (RunStatus.FAILED, RunStatus.LOST)
# The stream's kinds a span needs; text deltas and the rest are never read.
SPAN_KINDS = ("tool-use", "tool-result", "usage")


def _digest(kind: str, *parts: str) -> bytes:
    return hashlib.sha256("\x1f".join(("canopy", kind, *parts)).encode()).digest()


def _nonzero(value: int) -> int:
    # An all-zero id is invalid in OTLP; a hash that gives one (2^-64) is nudged.
    return value or 1


def trace_id(root_run_id: str) -> int:
    return _nonzero(int.from_bytes(_digest("trace", root_run_id)[:16], "big"))


def run_span_id(run_id: str) -> int:
    return _nonzero(int.from_bytes(_digest("run", run_id)[:8], "big"))


def tool_span_id(run_id: str, tool_call_id: str) -> int:
    return _nonzero(int.from_bytes(_digest("tool", run_id, tool_call_id)[:8], "big"))


def _ns(moment) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def resource() -> Resource:
    """``service.name`` from OTEL_SERVICE_NAME; ``Resource.create`` merges OTEL_RESOURCE_ATTRIBUTES."""
    return Resource.create({"service.name": settings.OTEL_SERVICE_NAME})


@dataclass
class _ToolCall:
    call_id: str
    name: str
    started: object
    arguments: object = None
    ended: object = None
    success: bool | None = None
    result: object = None
    error: str | None = None


def _json(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


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


def build_spans(runs: list[RunRow], *, now=None, capture: bool | None = None) -> list[ReadableSpan]:
    """Every span of ``runs`` (each run's own and its tool calls'), a few queries in all."""
    if not runs:
        return []
    now = now or timezone.now()
    capture = (
        settings.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT if capture is None else capture
    )
    calls, models = _stream_of(runs)
    pauses = _pauses_of(runs)
    started_by_call = _parent_calls(runs)
    res = resource()
    spans: list[ReadableSpan] = []
    for run in runs:
        spans.append(
            _run_span(
                run,
                models.get(run.pk),
                started_by_call,
                res=res,
                now=now,
                capture=capture,
                pauses=pauses.get(run.pk, ()),
            )
        )
        for call in calls.get(run.pk, ()):
            spans.append(_tool_span(run, call, res=res, now=now, capture=capture))
    return spans


def _stream_of(runs):
    """Each run's tool calls in stream order, and the model its latest usage named."""
    calls: dict[int, list[_ToolCall]] = defaultdict(list)
    open_calls: dict[tuple[int, str], _ToolCall] = {}
    models: dict[int, str] = {}
    rows = (
        Event.objects.filter(run_id__in=[run.pk for run in runs], kind__in=SPAN_KINDS)
        .order_by("run_id", "sequence")
        .values_list(
            "run_id",
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
    for run_pk, kind, name, call_id, data, output, success, error, at in rows:
        if kind == "usage":
            if isinstance(data, dict) and isinstance(data.get("model"), str) and data["model"]:
                models[run_pk] = data["model"]
            continue
        if not call_id:
            continue
        call = open_calls.get((run_pk, call_id))
        if kind == "tool-use":
            if call is None:
                call = _ToolCall(call_id, name or "tool", at, arguments=data)
                open_calls[(run_pk, call_id)] = call
                calls[run_pk].append(call)
        elif call is not None and call.ended is None:
            call.ended, call.success, call.result, call.error = at, success, output, error
            if name and call.name == "tool":
                call.name = name
    return calls, models


def _parent_calls(runs) -> set[tuple[int, str]]:
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


def _root_run_id(run: RunRow) -> str:
    return run.root_run_id or run.run_id


def _pauses_of(runs) -> dict[int, list[SpanEvent]]:
    """SPEC §14: each run's pauses and resumes, as span events at the moment they happened."""
    out: dict[int, list[SpanEvent]] = defaultdict(list)
    rows = (
        Event.objects.filter(run_id__in=[run.pk for run in runs], kind__in=("paused", "resumed"))
        .order_by("run_id", "sequence")
        .values_list("run_id", "kind", "actor", "text", "created_at")
    )
    for run_pk, kind, actor, text, at in rows:
        attributes = {"canopy.actor": actor or "", "canopy.text": (text or "")[:500]}
        out[run_pk].append(SpanEvent(f"canopy.{kind}", attributes, _ns(at)))
    return out


def _run_span(run: RunRow, model, started_by_call, *, res, now, capture, pauses=()) -> ReadableSpan:
    tid = trace_id(_root_run_id(run))
    parent = None
    if run.parent_id:
        if run.tool_call_id and (run.parent_id, run.tool_call_id) in started_by_call:
            parent_span = tool_span_id(run.parent_run_id, run.tool_call_id)
        else:
            parent_span = run_span_id(run.parent_run_id)
        parent = parent_span
    profile = run.profile or run.session_profile or "agent"
    attributes = {
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value,
        gen_ai.GEN_AI_AGENT_NAME: profile,
        gen_ai.GEN_AI_AGENT_ID: run.run_id,
        gen_ai.GEN_AI_CONVERSATION_ID: run.conversation_id,
        OPENINFERENCE_KIND: "AGENT",
        "canopy.depth": run.depth,
        "canopy.status": run.status,
        "canopy.via": run.via,
        "canopy.runner": run.runner_name,
    }
    if model:
        attributes[gen_ai.GEN_AI_REQUEST_MODEL] = model
        attributes[gen_ai.GEN_AI_RESPONSE_MODEL] = model
    attributes.update(_usage_attributes(run))
    if run.paused_seconds:
        # Time stopped by a pause (SPEC §14); the span's duration includes it.
        attributes["canopy.paused_seconds"] = float(run.paused_seconds)
    if capture:
        attributes.update(_content_attributes(run))
    if run.status in ERROR_STATUSES:
        status = Status(StatusCode.ERROR, (run.error or run.status)[:500])
        attributes["error.type"] = run.status
    elif run.is_terminal:
        status = Status(StatusCode.OK)
    else:
        status = Status(StatusCode.UNSET)
    return _span(
        f"invoke_agent {profile}",
        tid,
        run_span_id(run.run_id),
        parent,
        attributes,
        status,
        run.created_at,
        run.finished_at or now,
        res,
        events=pauses,
    )


def _usage_attributes(run: RunRow) -> dict:
    attributes = {}
    if run.tokens_in is not None:  # every run has its rollup row; seeded ones may not
        attributes.update(
            {
                gen_ai.GEN_AI_USAGE_INPUT_TOKENS: run.tokens_in,
                gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: run.tokens_out,
                gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: run.cache_read,
                gen_ai.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: run.cache_write,
                COST_AMOUNT: run.cost_nanos / 1e9,
                COST_CURRENCY: "USD",
                # Phoenix's token columns (OpenInference names).
                "llm.token_count.prompt": run.tokens_in,
                "llm.token_count.completion": run.tokens_out,
                "llm.token_count.total": run.tokens_in + run.tokens_out,
            }
        )
    return attributes


def _content_attributes(run: RunRow) -> dict:
    """Message text: only with OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT."""
    attributes = {}
    message = (run.request or {}).get("message") if isinstance(run.request, dict) else None
    if isinstance(message, str):
        attributes[gen_ai.GEN_AI_INPUT_MESSAGES] = json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": message}]}]
        )
        attributes["input.value"] = message
    if run.output:
        attributes[gen_ai.GEN_AI_OUTPUT_MESSAGES] = json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": run.output}]}]
        )
        attributes["output.value"] = run.output
    return attributes


def _tool_span(run: RunRow, call: _ToolCall, *, res, now, capture) -> ReadableSpan:
    tid = trace_id(_root_run_id(run))
    attributes = {
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value,
        gen_ai.GEN_AI_TOOL_NAME: call.name,
        gen_ai.GEN_AI_TOOL_CALL_ID: call.call_id,
        OPENINFERENCE_KIND: "TOOL",
        "tool.name": call.name,
    }
    if call.success is not None:
        attributes["canopy.tool.success"] = call.success
    if capture:
        if call.arguments is not None:
            attributes[gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS] = _json(call.arguments)
            attributes["input.value"] = _json(call.arguments)
        if call.result is not None:
            attributes[gen_ai.GEN_AI_TOOL_CALL_RESULT] = _json(call.result)
            attributes["output.value"] = _json(call.result)
    if call.success is False:
        # The error text is the tool's output, so it is content: only its presence otherwise.
        status = Status(
            StatusCode.ERROR, (call.error or "tool failed")[:500] if capture else "tool failed"
        )
        attributes["error.type"] = "tool_error"
    elif call.ended is not None:
        status = Status(StatusCode.OK)
    else:
        status = Status(StatusCode.UNSET)
    return _span(
        f"execute_tool {call.name}",
        tid,
        tool_span_id(run.run_id, call.call_id),
        run_span_id(run.run_id),
        attributes,
        status,
        call.started,
        call.ended or run.finished_at or now,
        res,
    )


def _span(name, tid, span_id, parent_id, attributes, status, started, ended, res, events=()):
    """One finished span (the SDK's own type, so its encoder and exporter take it as is);
    an end before the start (clock steps between rows) is clamped to the start."""
    start_ns = _ns(started)
    return ReadableSpan(
        name=name,
        context=SpanContext(tid, span_id, is_remote=False, trace_flags=TraceFlags.SAMPLED),
        parent=None
        if parent_id is None
        else SpanContext(tid, parent_id, is_remote=False, trace_flags=TraceFlags.SAMPLED),
        resource=res,
        attributes=attributes,
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=start_ns,
        end_time=max(_ns(ended), start_ns),
        events=tuple(events),
        instrumentation_scope=SCOPE,
    )

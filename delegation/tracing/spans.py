"""SPEC §12's mapping from the record to OpenTelemetry spans (the SDK's ``ReadableSpan``).

A run is ``invoke_agent {profile}`` (its task in ``gen_ai.agent.description`` when message
content is exported); each usage report of its stream is an LLM span ``chat {model}`` under it,
the span Phoenix sums tokens and prices cost from (it counts only LLM-kind spans); each tool call of its stream (a ``tool-use`` event and
its ``tool-result``) is ``execute_tool {toolName}`` under it; a child run started from a tool
call hangs under that call's span, otherwise under its parent run's span. Ids are hashes of
stored identities: the trace id of the root's runId, a run's span id of its runId, a tool
call's of (runId, toolCallId), a usage report's of (runId, sequence), so exporting again (or a run's final spans after its
open-run ones) gives the same ids and backends replace rather than duplicate.
"""

from __future__ import annotations

import hashlib
import json

from django.conf import settings
from django.utils import timezone
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from delegation.models import RunStatus
from delegation.tracing.reads import (
    RunRow,
    ToolCall,
    Usage,
    nanos,
    parent_calls,
    pauses_of,
    stream_of,
)

SCOPE = InstrumentationScope("canopy", "1")
# Not (yet) in opentelemetry-semantic-conventions: the names SPEC §12 fixes.
COST_AMOUNT = "gen_ai.usage.cost.amount"
COST_CURRENCY = "gen_ai.usage.cost.currency"
# Phoenix's own key for its views (OpenInference), set beside the gen_ai ones.
OPENINFERENCE_KIND = "openinference.span.kind"
ERROR_STATUSES = (RunStatus.FAILED, RunStatus.LOST)


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


def usage_span_id(run_id: str, sequence: int) -> int:
    return _nonzero(int.from_bytes(_digest("usage", run_id, str(sequence))[:8], "big"))


def resource() -> Resource:
    """``service.name`` from OTEL_SERVICE_NAME; ``Resource.create`` merges OTEL_RESOURCE_ATTRIBUTES."""
    return Resource.create({"service.name": settings.OTEL_SERVICE_NAME})


def _json(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def build_spans(runs: list[RunRow], *, now=None, capture: bool | None = None) -> list[ReadableSpan]:
    """Every span of ``runs`` (each run's own and its tool calls'), a few queries in all."""
    if not runs:
        return []
    now = now or timezone.now()
    capture = (
        settings.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT if capture is None else capture
    )
    calls, models, usages = stream_of(runs)
    pauses = pauses_of(runs)
    started_by_call = parent_calls(runs)
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
        for usage in usages.get(run.pk, ()):
            spans.append(_usage_span(run, usage, models.get(run.pk), res=res))
    return spans


def _root_run_id(run: RunRow) -> str:
    return run.root_run_id or run.run_id


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
        if run.task:
            # What ran, beside the SPEC's name (issue 38): the task is message text, so only
            # with content capture.
            attributes[gen_ai.GEN_AI_AGENT_DESCRIPTION] = run.task
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


def _count(data: dict, key: str) -> int:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _usage_span(run: RunRow, usage: Usage, run_model, *, res) -> ReadableSpan:
    """One usage report as an LLM span: Phoenix adds its ``llm.token_count.*`` into the
    trace's totals and prices it from ``llm.model_name`` (its own price table, where the
    operator enters the model's prices). The figures are the stored event's, the same ones
    Canopy's rollups add up."""
    data = usage.data
    model = data.get("model") if isinstance(data.get("model"), str) and data["model"] else None
    model = model or run_model or "unknown"
    tokens_in = _count(data, "inputTokens")
    tokens_out = _count(data, "outputTokens")
    attributes = {
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.CHAT.value,
        gen_ai.GEN_AI_REQUEST_MODEL: model,
        gen_ai.GEN_AI_RESPONSE_MODEL: model,
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS: tokens_in,
        gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: tokens_out,
        OPENINFERENCE_KIND: "LLM",
        "llm.model_name": model,
        "llm.token_count.prompt": tokens_in,
        "llm.token_count.completion": tokens_out,
        "llm.token_count.total": tokens_in + tokens_out,
        "canopy.run": run.run_id,
    }
    cost = data.get("costUsd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        attributes[COST_AMOUNT] = float(cost)
        attributes[COST_CURRENCY] = "USD"
    return _span(
        f"chat {model}",
        trace_id(_root_run_id(run)),
        usage_span_id(run.run_id, usage.sequence),
        run_span_id(run.run_id),
        attributes,
        Status(StatusCode.OK),
        usage.at,
        usage.at,
        res,
    )


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


def _tool_span(run: RunRow, call: ToolCall, *, res, now, capture) -> ReadableSpan:
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
    start_ns = nanos(started)
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
        end_time=max(nanos(ended), start_ns),
        events=tuple(events),
        instrumentation_scope=SCOPE,
    )

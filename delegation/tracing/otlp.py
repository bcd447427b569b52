"""OTLP out: the official SDK exporter configured from settings, and the OTLP JSON encoding.

Both go through the SDK's own protobuf encoder (``encode_spans``), so a file from
``GET /api/runs/{runId}/trace`` holds exactly what the exporter would have sent.
"""

from __future__ import annotations

import base64
from urllib.parse import unquote

from django.conf import settings
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from delegation.tracing import reads, spans

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def parse_headers(raw: str) -> dict[str, str]:
    """The OTEL_EXPORTER_OTLP_*HEADERS format: ``key=value`` pairs, comma-separated, URL-encoded."""
    headers = {}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            headers[unquote(key.strip()).lower()] = unquote(value.strip())
    return headers


def headers() -> dict[str, str]:
    merged = parse_headers(settings.OTEL_EXPORTER_OTLP_HEADERS)
    merged.update(parse_headers(settings.OTEL_EXPORTER_OTLP_TRACES_HEADERS))
    return merged


def exporter(url: str | None = None) -> OTLPSpanExporter:
    """An exporter for the configured traces endpoint (or ``url``)."""
    return OTLPSpanExporter(
        endpoint=url or settings.OTEL_TRACES_URL,
        headers=headers(),
        timeout=settings.OTEL_EXPORT_TIMEOUT_SECONDS,
    )


def trace_json(run_pks) -> dict:
    """The OTLP JSON of the given runs' spans (the REST trace and ``export_traces --json``)."""
    return to_json(spans.build_spans(reads.runs_for_export(run_pks)))


def to_json(span_list) -> dict:
    """The OTLP/JSON ``ExportTraceServiceRequest`` of ``spans``: lowerCamelCase keys, enums
    as integers, and trace and span ids as hex strings (OTLP/JSON's rule, unlike protobuf's
    JSON mapping, which would give base64)."""
    document = MessageToDict(encode_spans(span_list), use_integers_for_enums=True)
    for resource_spans in document.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for key in _ID_KEYS:
                    if key in span:
                        span[key] = _hex(span[key])
    return document


def _hex(value: str) -> str:
    return base64.b64decode(value).hex()

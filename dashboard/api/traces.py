"""A run's subtree as one OpenTelemetry trace in OTLP JSON (SPEC §12), on the runs router."""

from django.http import JsonResponse

from dashboard.api.core import READ, NoParams, strict_query
from dashboard.api.rows import find_run

# The runs resource has one router: ninja answers 405 for a path two routers share.
from dashboard.api.runs import router
from delegation import selectors
from delegation.tracing import otlp


@router.get(
    "/runs/{runId}/trace",
    response={**READ},
    summary="The run and its subtree as an OTLP JSON trace",
    description="An OTLP/JSON `ExportTraceServiceRequest` (`resourceSpans`), the spans the "
    "exporter sends (SPEC §12): one `invoke_agent {profile}` span per run and one "
    "`execute_tool {toolName}` span per tool call, with the same ids as every export. Message "
    "text only with `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`. Import it into "
    "any tool that reads OTLP JSON files.",
    openapi_extra={
        "responses": {
            "200": {
                "description": "OTLP JSON",
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        }
    },
)
@strict_query(NoParams)
def get_trace(request, runId: str):  # noqa: N803
    run = find_run(runId)
    pks = selectors.subtree_run_ids(run)
    document = otlp.trace_json(pks)
    return JsonResponse(document)

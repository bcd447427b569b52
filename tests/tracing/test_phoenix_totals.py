"""Phoenix's totals of a tree equal Canopy's (issue 38: they showed $0 and 0 tokens, the
figures being only on AGENT spans, which Phoenix does not add up). Against a real Phoenix: each
usage report is an LLM span Phoenix sums; Phoenix prices it from its own model table, here
given the prices Canopy's table has (as an operator enters them in Phoenix's settings)."""

from __future__ import annotations

import json
import time
import urllib.request
from decimal import Decimal

import pytest

from delegation.models import ModelPrice, Run
from delegation.runner_socket import methods
from delegation.tracing import spans as mapping
from tests.support.api import drive_runner, emit, start_child

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "claude-phx-totals-1"
INPUT_PER_MTOK, OUTPUT_PER_MTOK = 3.0, 15.0


def _graphql(phoenix, query: str, variables: dict | None = None) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(
        phoenix.base + "/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        out = json.loads(answer.read())
    assert not out.get("errors"), out["errors"]
    return out["data"]


def _usage(tokens_in: int, tokens_out: int) -> dict:
    # No costUsd: Canopy prices it from its table, Phoenix from its own.
    return {
        "kind": "usage",
        "input": {"inputTokens": tokens_in, "outputTokens": tokens_out, "model": MODEL},
    }


TRACE_TOTALS = """query($trace: ID!) {
  projects { edges { node { name trace(traceId: $trace) {
    numSpans
    costSummary { total { cost tokens } }
    rootSpans: spans(first: 50) { edges { node { name parentId spanKind
      cumulativeTokenCountTotal } } }
  } } } }
}"""


def _phoenix_totals(phoenix, trace_hex: str, spans: int, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        data = _graphql(phoenix, TRACE_TOTALS, {"trace": trace_hex})
        traces = [e["node"]["trace"] for e in data["projects"]["edges"] if e["node"]["trace"]]
        if traces and traces[0]["numSpans"] >= spans and traces[0]["costSummary"]["total"]["cost"]:
            return traces[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"Phoenix's trace {trace_hex} is still {traces}")
        time.sleep(0.25)


def test_phoenix_sums_the_same_tokens_and_cost_as_canopy(phoenix, daphne_factory, settings):
    _graphql(
        phoenix,
        """mutation($input: CreateModelMutationInput!) { createModel(input: $input) { model { id } } }""",
        {
            "input": {
                "name": MODEL,
                "namePattern": f"^{MODEL}$",
                "costs": [
                    {
                        "tokenType": "input",
                        "costPerMillionTokens": INPUT_PER_MTOK,
                        "kind": "PROMPT",
                    },
                    {
                        "tokenType": "output",
                        "costPerMillionTokens": OUTPUT_PER_MTOK,
                        "kind": "COMPLETION",
                    },
                ],
            }
        },
    )
    ModelPrice.objects.create(
        model=MODEL,
        input_per_mtok=Decimal(str(INPUT_PER_MTOK)),
        output_per_mtok=Decimal(str(OUTPUT_PER_MTOK)),
    )
    time.sleep(6)  # Phoenix's model store re-reads its table every 5 s
    settings.OTEL_EXPORT_ENABLED = True
    settings.OTEL_TRACES_URL = phoenix.traces_url
    daphne_factory(
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=phoenix.traces_url,
        OTEL_SERVICE_NAME="canopy-phoenix-totals",
        MAINTENANCE_INTERVAL_SECONDS="0.1",
    )
    conn = drive_runner("runner-phx-totals", host="host-phx-totals")
    root = "phx-totals-root"
    methods.open_run(
        conn,
        {
            "conversationId": "conv-phx-totals",
            "runId": root,
            "extensionId": "ext",
            "profile": "worker",
        },
    )
    emit(conn, root, [_usage(12000, 800), _usage(3000, 1500)])
    child = start_child(conn, root, "phx-totals-req")["runId"]
    emit(conn, child, [_usage(4000, 250)])
    methods.finish_run(conn, {"runId": child, "output": "child done"})
    methods.finish_run(conn, {"runId": root, "output": "root done"})

    rollup = Run.objects.select_related("rollup").get(run_id=root).rollup
    canopy_tokens = rollup.sub_tokens_in + rollup.sub_tokens_out
    canopy_cost = rollup.sub_cost_nanos / 1e9
    assert canopy_tokens == 19000 + 2550 and canopy_cost > 0

    trace_hex = f"{mapping.trace_id(root):032x}"
    # 2 runs + 3 usage reports.
    trace = _phoenix_totals(phoenix, trace_hex, spans=5)
    total = trace["costSummary"]["total"]
    assert total["tokens"] == canopy_tokens
    assert total["cost"] == pytest.approx(canopy_cost, rel=1e-9)
    spans = [e["node"] for e in trace["rootSpans"]["edges"]]
    top = [s for s in spans if s["name"] == "invoke_agent worker" and s["parentId"] is None]
    assert len(top) == 1 and top[0]["cumulativeTokenCountTotal"] == canopy_tokens
    assert sorted(s["spanKind"] for s in spans) == ["agent", "agent", "llm", "llm", "llm"]

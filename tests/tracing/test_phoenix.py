"""SPEC §12 against a real Arize Phoenix: a tree of three levels, queued as its runs end and
sent by the server's own upkeep loop, read back through Phoenix's REST API."""

from __future__ import annotations

import json

import pytest

from delegation.tracing import spans as mapping
from tests.support.traces import SECRET, build_trace_tree

pytestmark = pytest.mark.django_db(transaction=True)


def _by_name(found):
    return {span["name"]: span for span in found}


def test_it_shows_a_tree_in_phoenix_as_one_trace_of_agents_and_tools(
    phoenix,
    daphne_factory,
    settings,
):
    # Long on purpose: one Phoenix trace, read back once, checked attribute by attribute.
    # This process ends the runs (queueing their export); the server's upkeep loop sends.
    settings.OTEL_EXPORT_ENABLED = True
    settings.OTEL_TRACES_URL = phoenix.traces_url
    daphne_factory(
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=phoenix.traces_url,
        OTEL_SERVICE_NAME="canopy-phoenix-test",
        MAINTENANCE_INTERVAL_SECONDS="0.1",
    )
    tree = build_trace_tree("phx")
    trace_hex = f"{mapping.trace_id(tree.root):032x}"
    found = phoenix.wait_for_spans(trace_hex, tree.spans)
    assert len(found) == tree.spans, [s["name"] for s in found]

    by_id = {span["context"]["span_id"]: span for span in found}
    runs = {
        s["attributes"]["gen_ai.agent.id"]: s for s in found if "gen_ai.agent.id" in s["attributes"]
    }
    tools = {
        s["attributes"]["gen_ai.tool.call.id"]: s
        for s in found
        if "gen_ai.tool.call.id" in s["attributes"]
    }
    assert set(runs) == {tree.root, tree.a, tree.g, tree.b}
    assert set(tools) == {"c-root-1", "g-1", "g-2", "c-a-1"}

    root = runs[tree.root]
    assert root["name"] == "invoke_agent worker"
    assert root["parent_id"] is None
    assert root["span_kind"] == "AGENT"
    attrs = root["attributes"]
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.agent.name"] == "worker"
    assert attrs["gen_ai.conversation.id"] == "conv-phx"
    assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == "claude-test-1"
    assert attrs["gen_ai.usage.input_tokens"] == 1000
    assert attrs["gen_ai.usage.output_tokens"] == 200
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 300
    assert attrs["gen_ai.usage.cache_creation.input_tokens"] == 40
    assert attrs["gen_ai.usage.cost.amount"] == pytest.approx(0.125)
    assert attrs["gen_ai.usage.cost.currency"] == "USD"
    assert attrs["canopy.depth"] == 0
    assert attrs["canopy.status"] == "succeeded"
    assert attrs["canopy.via"] == "runner"
    assert attrs["canopy.runner"] == "runner-phx"
    assert root["status_code"] == "OK"

    # Parentage: the delegate tool call under its run, the child run under that tool call.
    delegate = tools["c-root-1"]
    assert delegate["name"] == "execute_tool delegate"
    assert delegate["span_kind"] == "TOOL"
    assert delegate["attributes"]["gen_ai.operation.name"] == "execute_tool"
    assert delegate["attributes"]["gen_ai.tool.name"] == "delegate"
    assert delegate["parent_id"] == root["context"]["span_id"]
    assert runs[tree.a]["parent_id"] == delegate["context"]["span_id"]
    assert tools["c-a-1"]["parent_id"] == runs[tree.a]["context"]["span_id"]
    assert runs[tree.g]["parent_id"] == tools["c-a-1"]["context"]["span_id"]
    # A child started without a tool call hangs under its parent run.
    assert runs[tree.b]["parent_id"] == root["context"]["span_id"]
    assert runs[tree.b]["name"] == "invoke_agent reviewer"
    assert all(span["parent_id"] in by_id for span in found if span["parent_id"])

    # Error status: the failed run, and the failed tool call.
    failed = runs[tree.g]
    assert failed["status_code"] == "ERROR"
    assert failed["status_message"] == "boom"
    assert failed["attributes"]["canopy.status"] == "failed"
    assert failed["attributes"]["canopy.depth"] == 2
    assert failed["attributes"]["gen_ai.response.model"] == "claude-small"
    assert failed["attributes"]["gen_ai.usage.cost.amount"] == pytest.approx(0.001)
    assert tools["g-2"]["status_code"] == "ERROR"
    assert tools["g-1"]["status_code"] == "OK"
    assert runs[tree.a]["status_code"] == "OK"

    # Content capture is off by default: no message text in any attribute.
    assert SECRET not in json.dumps([span["attributes"] for span in found])
    assert SECRET not in json.dumps([span["status_message"] for span in found])

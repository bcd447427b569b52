"""SPEC §12's durable export and its on-demand doors, against a real OTLP/HTTP receiver
(tests/support/otlp_receiver.py: protobuf decoded with opentelemetry-proto)."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from delegation.models import TraceExport
from delegation.runner_socket import methods
from delegation.tracing import queue, reads, sender
from delegation.tracing import spans as mapping
from tests.support.api import drive_runner, emit
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.traces import SECRET, build_trace_tree


@pytest.fixture
def receiver():
    started = OtlpReceiver().start()
    yield started
    started.stop()


def _exported(settings, url):
    settings.OTEL_EXPORT_ENABLED = True
    settings.OTEL_TRACES_URL = url
    settings.OTEL_EXPORT_TIMEOUT_SECONDS = 1.0


def _scrape(server) -> dict:
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    figures = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("canopy_trace"):
                figures[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return figures


def _wait(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _span_ids(document) -> list[str]:
    return [
        span["spanId"]
        for resource_spans in document["resourceSpans"]
        for scope_spans in resource_spans["scopeSpans"]
        for span in scope_spans["spans"]
    ]


def _spans(document) -> list[dict]:
    return [
        span
        for resource_spans in document["resourceSpans"]
        for scope_spans in resource_spans["scopeSpans"]
        for span in scope_spans["spans"]
    ]


@pytest.mark.django_db(transaction=True)
def test_it_loses_nothing_while_the_collector_is_down_and_sends_each_span_once(
    receiver, daphne_factory, settings, as_
):
    receiver.stop()  # the collector is down from the start; its port is kept for later
    _exported(settings, receiver.url)
    server = daphne_factory(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{receiver.port}",
        OTEL_EXPORTER_OTLP_HEADERS="x-canopy-test=one%20two,authorization=Bearer%20k-1",
        OTEL_SERVICE_NAME="canopy-outage",
        OTEL_EXPORT_TIMEOUT_SECONDS="0.5",
        OTEL_EXPORT_RETRY_FIRST_SECONDS="0.2",
        OTEL_EXPORT_RETRY_MAX_SECONDS="0.5",
        MAINTENANCE_INTERVAL_SECONDS="0.1",
    )
    tree = build_trace_tree("outage")
    failed = ("canopy_trace_spans_exported_total", (("outcome", "failed"),))
    failing = ("canopy_trace_export_queue", (("state", "failing"),))
    _wait(lambda: _scrape(server).get(failed, 0) > 0, what="a failed export")
    # Every run of the tree waits after a failed request, none is dropped.
    _wait(lambda: _scrape(server).get(failing) == 4, what="all four runs failing")
    assert receiver.requests == 0

    receiver.start()
    _wait(lambda: len(set(receiver.span_ids())) >= tree.spans, what="every span")
    pending = ("canopy_trace_export_queue", (("state", "pending"),))
    _wait(lambda: _scrape(server).get(pending) == 0, what="an empty queue")
    time.sleep(0.5)  # a duplicate would be sent on the next ticks

    expected = _span_ids(as_("viewer").get(f"/api/runs/{tree.root}/trace").json())
    assert sorted(receiver.span_ids()) == sorted(expected)  # each exactly once
    names = {
        attribute.value.string_value
        for resource in receiver.resources
        for attribute in resource.attributes
        if attribute.key == "service.name"
    }
    assert names == {"canopy-outage"}
    assert all(h["x-canopy-test"] == "one two" for h in receiver.headers)
    assert all(h["authorization"] == "Bearer k-1" for h in receiver.headers)
    assert _scrape(server)[("canopy_trace_export_queue", (("state", "sent"),))] == 4
    assert "Bearer k-1" not in server.log()


@pytest.mark.django_db
def test_it_answers_a_subtree_as_otlp_json_with_the_same_ids_every_time(as_, settings):
    tree = build_trace_tree("json")
    viewer = as_("viewer")
    first = viewer.get(f"/api/runs/{tree.root}/trace")
    assert first.status_code == 200
    document = first.json()
    assert viewer.get(f"/api/runs/{tree.root}/trace").json() == document
    found = _spans(document)
    assert len(found) == tree.spans
    trace_hex = f"{mapping.trace_id(tree.root):032x}"
    assert {span["traceId"] for span in found} == {trace_hex}
    assert all(len(span["spanId"]) == 16 for span in found)
    names = sorted(span["name"] for span in found)
    assert names == sorted(
        ["invoke_agent worker"] * 3
        + ["invoke_agent reviewer"]
        + ["execute_tool delegate"] * 2
        + ["execute_tool grep", "execute_tool shell"]
        # Each usage report is an LLM span (issue 38: what Phoenix sums).
        + ["chat claude-test-1"] * 2
        + ["chat claude-small"]
    )
    failed = next(s for s in found if s["spanId"] == f"{mapping.run_span_id(tree.g):016x}")
    assert failed["status"] == {"code": 2, "message": "boom"}
    assert failed["parentSpanId"] == f"{mapping.tool_span_id(tree.a, 'c-a-1'):016x}"
    assert SECRET not in json.dumps(document)

    # A subtree: the child run, its tool calls and its own child, same ids.
    sub = _spans(viewer.get(f"/api/runs/{tree.a}/trace").json())
    assert len(sub) == 7  # A, its 3 tool calls, G, and their 2 usage reports
    assert {s["spanId"] for s in sub} <= {s["spanId"] for s in found}
    assert viewer.get("/api/runs/nope/trace").status_code == 404
    assert as_("anonymous").get(f"/api/runs/{tree.root}/trace").status_code in (401, 403)
    assert as_("outsider").get(f"/api/runs/{tree.root}/trace").status_code == 403

    # With capture on, the messages, arguments and results are there.
    settings.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = True
    captured = _spans(viewer.get(f"/api/runs/{tree.root}/trace").json())
    by_id = {s["spanId"]: {a["key"]: a["value"] for a in s["attributes"]} for s in captured}
    child = by_id[f"{mapping.run_span_id(tree.a):016x}"]
    assert SECRET in child["gen_ai.input.messages"]["stringValue"]
    assert SECRET in child["gen_ai.output.messages"]["stringValue"]
    # The task says what ran, beside the SPEC's span name (message text: capture only).
    assert child["gen_ai.agent.description"]["stringValue"] == f"task {SECRET}"
    tool = by_id[f"{mapping.tool_span_id(tree.a, 'g-1'):016x}"]
    assert SECRET in tool["gen_ai.tool.call.arguments"]["stringValue"]
    assert SECRET in tool["gen_ai.tool.call.result"]["stringValue"]


@pytest.mark.django_db
def test_it_sends_one_tree_now_with_export_traces(receiver, settings, as_, capsys):
    tree = build_trace_tree("cmd")
    _exported(settings, receiver.url)
    call_command("export_traces", "--root", tree.root)
    assert "sent 11 spans" in capsys.readouterr().out
    expected = _span_ids(as_("viewer").get(f"/api/runs/{tree.root}/trace").json())
    assert sorted(receiver.span_ids()) == sorted(expected)

    call_command("export_traces", "--root", tree.root, "--json")
    assert sorted(_span_ids(json.loads(capsys.readouterr().out))) == sorted(expected)
    with pytest.raises(CommandError, match="not a root run"):
        call_command("export_traces", "--root", tree.a)
    with pytest.raises(CommandError, match="no run"):
        call_command("export_traces", "--root", "missing")


@pytest.mark.django_db
def test_it_sends_a_long_open_run_so_far_and_again_complete_at_its_end(receiver, settings):
    _exported(settings, receiver.url)
    settings.OTEL_EXPORT_OPEN_AFTER_SECONDS = 60
    conn = drive_runner("runner-open", host="host-open")
    methods.open_run(conn, {"conversationId": "conv-open", "runId": "open-1", "extensionId": "ext"})
    emit(conn, "open-1", [{"kind": "tool-use", "toolName": "grep", "toolCallId": "t-1"}])
    assert queue.queue_open_runs() == 0  # not open long enough yet
    assert sender.drain() == (0, 0)

    assert queue.queue_open_runs(now=timezone.now() + timedelta(seconds=61)) == 1
    assert sender.drain() == (2, 0)
    run_span = f"{mapping.run_span_id('open-1'):016x}"
    so_far = {s.span_id.hex(): s for s in receiver.spans}
    assert so_far[run_span].status.code == 0  # unset: still running
    assert {a.key: a.value.string_value for a in so_far[run_span].attributes}["canopy.status"] == (
        "running"
    )

    methods.finish_run(conn, {"runId": "open-1", "output": "ok"})
    assert TraceExport.objects.get(run__run_id="open-1").final
    assert sender.drain() == (2, 0)
    final = [s for s in receiver.spans if s.span_id.hex() == run_span][-1]
    assert final.status.code == 1  # OK
    assert receiver.span_ids().count(run_span) == 2  # the same span, replaced at its end


@pytest.mark.django_db
def test_a_paused_runs_span_has_its_pauses_as_events_and_the_time_paused(receiver, settings):
    """SPEC §14 in OTel: status paused, each pause and resume a span event, paused seconds."""
    from delegation.models import Run
    from delegation.services.identity import Actor
    from delegation.services.pause import do_pause_run, do_resume_run

    _exported(settings, receiver.url)
    conn = drive_runner("runner-pause", host="host-pause")
    methods.open_run(conn, {"conversationId": "conv-p", "runId": "pause-1", "extensionId": "ext"})
    actor = Actor.system("test")
    do_pause_run(actor, Run.objects.get(run_id="pause-1"), reason="hold on")
    paused = {s.name: s for s in mapping.build_spans(reads.runs_for_export([_pk("pause-1")]))}
    span = next(iter(paused.values()))
    assert span.attributes["canopy.status"] == "paused"
    assert [e.name for e in span.events] == ["canopy.paused"]
    assert "hold on" in span.events[0].attributes["canopy.text"]
    Run.objects.filter(run_id="pause-1").update(paused_at=timezone.now() - timedelta(seconds=5))
    do_resume_run(actor, Run.objects.get(run_id="pause-1"))
    methods.finish_run(conn, {"runId": "pause-1", "output": "ok"})
    assert sender.drain()[1] == 0
    final = [s for s in receiver.spans if s.name.startswith("invoke_agent")][-1]
    assert [e.name for e in final.events] == ["canopy.paused", "canopy.resumed"]
    attributes = {a.key: a.value for a in final.attributes}
    assert attributes["canopy.paused_seconds"].double_value >= 5


def _pk(run_id: str) -> int:
    from delegation.models import Run

    return Run.objects.get(run_id=run_id).pk

"""Prometheus metrics (SPEC §10 "Metrics"): what is counted where, and the scrape.

Two kinds of figure, kept apart on purpose:

* **Counters and histograms** of things that happen (events stored, refusals, budget stops,
  webhook outcomes, ingest and push latency) are kept by the process where they happen. With
  several server processes, set ``PROMETHEUS_MULTIPROC_DIR`` to one empty directory shared by
  them (wiped before they start): every process writes its figures there and a scrape of any
  one process sums them all (prometheus-client's multiprocess collector).
* **State** (runs by status, runner connections, webhook deliveries by state) is read from the
  database at scrape time, so it is right however many processes serve and whichever one is
  scraped. Open live sockets are the exception: only their process knows them, so they are a
  gauge summed over the processes alive (``livesum``).

Everything here is cheap on the hot paths: an increment is a few microseconds (an mmap write
in multiprocess mode), and nothing reads the database but the scrape.
"""

from __future__ import annotations

import os
import re
import time

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily

MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)

EVENTS_STORED = Counter(
    "canopy_events_stored",
    "Events committed to run streams (origin: runner events, or the server's own)",
    ["origin"],
)
REFUSALS = Counter(
    "canopy_runner_refusals",
    "JSON-RPC errors answered to runners, by code (4401: handshake refused, bad token)",
    ["code"],
)
BUDGET_STOPS = Counter(
    "canopy_budget_stops",
    "Subtrees stopped by a budget (one per budget-exceeded)",
)
WEBHOOK_OUTCOMES = Counter(
    "canopy_webhook_deliveries",
    "Webhook delivery attempts by outcome: delivered (2xx), retry (scheduled again), given-up",
    ["outcome"],
)
INGEST_SECONDS = Histogram(
    "canopy_ingest_seconds",
    "Time to validate and commit one run.event frame (in a group commit: the group's)",
    buckets=LATENCY_BUCKETS,
)
PUSH_SECONDS = Histogram(
    "canopy_push_latency_seconds",
    "From an event's commit to its frame leaving a live socket (live pushes only)",
    buckets=LATENCY_BUCKETS,
)
TRACE_SPANS = Counter(
    "canopy_trace_spans_exported",
    "Spans sent to the OTLP collector by outcome: sent, failed (queued again with backoff)",
    ["outcome"],
)
LIVE_SOCKETS = Gauge(
    "canopy_live_sockets",
    "Open, authorised live sockets (/ws/live/)",
    multiprocess_mode="livesum",
)

# Live fan-out per process (dashboard.live.hub): the bench divides these by events delivered.
LIVE_READS = Counter(
    "canopy_live_reads",
    "Database reads of a run's state and events made for live sockets (shared per process)",
)
LIVE_DOORBELLS = Counter(
    "canopy_live_doorbells",
    "Channel-layer messages taken off the layer for live sockets",
)

# --- Approvals (SPEC §11) ---
APPROVALS_REQUESTED = Counter(
    "canopy_approvals_requested", "Approvals left pending for a person (policy did not decide)"
)
APPROVAL_DECISION_SECONDS = Histogram(
    "canopy_approval_decision_seconds",
    "From an approval's request to its decision, by who decided (policy, operator, timeout, "
    "cancel)",
    ["by"],
    buckets=(0.01, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600),
)


def approval_requested() -> None:
    APPROVALS_REQUESTED.inc()


def approval_decided(by: str, seconds: float) -> None:
    APPROVAL_DECISION_SECONDS.labels(by=by).observe(max(seconds, 0.0))


# ---

# Events older than this when pushed are a replay of history (a subscription from the
# start), not a push: they would say nothing about latency.
PUSH_OBSERVE_MAX_AGE = 60.0

# Retention (issue 28): rows each pass deleted, by kind, and passes by outcome.
RETENTION_DELETED = Counter(
    "canopy_retention_deleted",
    "Rows deleted by retention passes, by kind: events, runs, audit",
    ["kind"],
)
RETENTION_PASSES = Counter(
    "canopy_retention_passes",
    "Retention passes finished, by outcome: ok, failed",
    ["outcome"],
)


def retention_deleted(kind: str, count: int) -> None:
    RETENTION_DELETED.labels(kind=kind).inc(count)


def retention_pass(outcome: str) -> None:
    RETENTION_PASSES.labels(outcome=outcome).inc()


def events_stored(count: int, origin: str = "runner") -> None:
    EVENTS_STORED.labels(origin=origin).inc(count)


def refused(code) -> None:
    REFUSALS.labels(code=str(code)).inc()


def budget_stopped() -> None:
    BUDGET_STOPS.inc()


def webhook_outcome(outcome: str) -> None:
    WEBHOOK_OUTCOMES.labels(outcome=outcome).inc()


def traces_exported(count: int, outcome: str) -> None:
    TRACE_SPANS.labels(outcome=outcome).inc(count)


def pushed(created_ms: int | None) -> None:
    if created_ms is None:
        return
    age = time.time() - created_ms / 1000
    if 0 <= age <= PUSH_OBSERVE_MAX_AGE:
        PUSH_SECONDS.observe(age)


class DatabaseCollector:
    """State read from the database at scrape time (the same answer from every process)."""

    def collect(self):
        from django.db.models import Count, Q

        from delegation.models import (
            DeliveryState,
            Run,
            Runner,
            RunnerState,
            RunStatus,
            TraceExport,
            WebhookDelivery,
        )

        runs = GaugeMetricFamily("canopy_runs", "Runs by status", labels=["status"])
        counts = dict(Run.objects.order_by().values_list("status").annotate(n=Count("pk")))
        for status in RunStatus.values:
            runs.add_metric([status], counts.get(status, 0))
        yield runs

        runners = GaugeMetricFamily(
            "canopy_runners",
            "Runner tokens by connection state (connected, disconnected: in its grace "
            "period or never connected, lost, revoked)",
            labels=["state"],
        )
        counts = dict(
            Runner.objects.with_state().order_by().values_list("state").annotate(n=Count("pk"))
        )
        for state in RunnerState.values:
            runners.add_metric([state], counts.get(state, 0))
        yield runners

        deliveries = GaugeMetricFamily(
            "canopy_webhook_deliveries_stored",
            "Stored webhook deliveries by state",
            labels=["state"],
        )
        states = dict(
            WebhookDelivery.objects.order_by().values_list("state").annotate(n=Count("pk"))
        )
        for state in DeliveryState.values:
            deliveries.add_metric([state], states.get(state, 0))
        yield deliveries

        # Trace export (SPEC §12): runs whose spans wait, wait after a failed request, or
        # were sent.
        traces = GaugeMetricFamily(
            "canopy_trace_export_queue",
            "Runs in the trace export queue by state (pending, failing: pending after a "
            "failed request, sent)",
            labels=["state"],
        )
        queued = TraceExport.objects.aggregate(
            pending=Count("pk", filter=Q(sent=False)),
            failing=Count("pk", filter=Q(sent=False, attempts__gt=0)),
            sent=Count("pk", filter=Q(sent=True)),
        )
        for state in ("pending", "failing", "sent"):
            traces.add_metric([state], queued[state] or 0)
        yield traces
        yield _pending_approvals()


def _pending_approvals():
    from delegation.models import Approval, ApprovalStatus

    pending = GaugeMetricFamily("canopy_approvals_pending", "Approvals waiting for a decision")
    pending.add_metric([], Approval.objects.filter(status=ApprovalStatus.PENDING).count())
    return pending


_PID_FILE = re.compile(r"_(\d+)\.db$")


def _forget_dead_processes(path: str) -> None:
    """A server process killed without a clean exit leaves its live-socket gauge behind;
    a livesum must count only processes that are alive."""
    from prometheus_client import multiprocess

    for name in os.listdir(path):
        if not name.startswith("gauge_live"):
            continue
        match = _PID_FILE.search(name)
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, path)
        except PermissionError:
            pass  # alive, another user's


def scrape() -> bytes:
    """The Prometheus text exposition of every metric above, for ``GET /metrics``."""
    registry = CollectorRegistry(auto_describe=False)
    if MULTIPROCESS:
        from prometheus_client import multiprocess

        path = os.environ["PROMETHEUS_MULTIPROC_DIR"]
        _forget_dead_processes(path)
        multiprocess.MultiProcessCollector(registry, path=path)
    else:
        from prometheus_client import REGISTRY

        registry.register(_Forward(REGISTRY))
    registry.register(DatabaseCollector())
    return generate_latest(registry)


class _Forward:
    """The default registry's metrics (this process's counters, plus process_* figures)."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        return self.registry.collect()


def _mark_this_process_dead() -> None:
    if MULTIPROCESS:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())


if MULTIPROCESS:
    import atexit

    atexit.register(_mark_this_process_dead)

"""Every tree is an OpenTelemetry trace (SPEC §12).

* ``spans``: the mapping, runs to ``invoke_agent`` spans and tool calls to ``execute_tool``
  spans, with ids derived from stored identities (the same tree always gives the same ids).
* ``otlp``: the official SDK's exporter configured from the standard ``OTEL_*`` settings, and
  the OTLP JSON encoding of ``GET /api/runs/{runId}/trace``.
* ``queue``: the durable export queue (``TraceExport`` rows) written as runs end.
* ``sender``: the upkeep loop's step that sends due rows in batches, with backoff.

This package reads the record and writes only its queue rows; it never imports the services
(they call ``queue.run_ended`` from ``mark_finished``).
"""

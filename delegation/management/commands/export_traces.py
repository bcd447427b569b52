"""Send one tree to the OTLP collector now (SPEC §12), or write it as OTLP JSON."""

import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from delegation.models import Run
from delegation.tracing import otlp
from delegation.tracing import sender as trace_sender


class Command(BaseCommand):
    help = (
        "Export the tree topped by --root (a runId) as one OpenTelemetry trace: sent to "
        "OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, or printed as OTLP JSON with --json."
    )

    def add_arguments(self, parser):
        parser.add_argument("--root", required=True, help="runId of the tree's root run")
        parser.add_argument(
            "--json", dest="as_json", action="store_true", help="print OTLP JSON, send nothing"
        )

    def handle(self, *args, root, as_json=False, **options):
        run = Run.objects.filter(run_id=root).first()
        if run is None:
            raise CommandError(f"no run {root!r}")
        top = run.root if run.root_id else run
        if top.pk != run.pk:
            raise CommandError(f"{root!r} is not a root run; its root is {top.run_id!r}")
        if as_json:
            pks = Run.objects.in_tree(run).values_list("pk", flat=True)
            document = otlp.trace_json(pks)
            self.stdout.write(_dumps(document))
            return
        if not settings.OTEL_EXPORT_ENABLED:
            raise CommandError("no OTLP endpoint: set OTEL_EXPORTER_OTLP_ENDPOINT")
        count, ok = trace_sender.send_tree(run)
        if not ok:
            raise CommandError(f"the collector did not take the trace ({count} spans)")
        self.stdout.write(f"sent {count} spans of tree {root}")


def _dumps(document) -> str:
    return json.dumps(document, indent=2)

"""Trace export throughput (run as ``python -m bench.trace_export --runs N`` in a bench
database): a tree of N runs, each with one tool call and a usage rollup, queued whole and
sent by the sender's own drain to a real OTLP/HTTP receiver on loopback (protobuf decoded);
prints spans/s and whether every span arrived exactly once, as JSON."""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "canopy.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.tree_seed import seed_tree  # noqa: E402
from delegation.models import Event, Run, RunRollup  # noqa: E402
from delegation.services import tokens  # noqa: E402
from delegation.tracing import queue, sender  # noqa: E402
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402


def _seed(total: int) -> Run:
    runner, _ = tokens.create_runner("trace-bench")
    tree = seed_tree(runner, total, prefix="tb")
    now = timezone.now()
    pks = list(
        Run.objects.in_tree(Run.objects.get(run_id=tree["root"])).values_list("pk", flat=True)
    )
    events, rollups = [], []
    for pk in pks:
        events.append(
            Event(
                run_id=pk,
                sequence=1,
                kind="tool-use",
                tool_name="grep",
                tool_call_id=f"t-{pk}",
                input={"q": "x"},
                created_at=now,
            )
        )
        events.append(
            Event(
                run_id=pk,
                sequence=2,
                kind="tool-result",
                tool_call_id=f"t-{pk}",
                tool_output=["a"],
                success=True,
                created_at=now,
            )
        )
        rollups.append(
            RunRollup(run_id=pk, own_tokens_in=1200, own_tokens_out=300, own_cost_nanos=8_100_000)
        )
    Event.objects.bulk_create(events, batch_size=5000)
    RunRollup.objects.bulk_create(rollups, batch_size=5000, ignore_conflicts=True)
    return Run.objects.get(run_id=tree["root"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()
    root = _seed(args.runs)
    receiver = OtlpReceiver().start()
    settings.OTEL_EXPORT_ENABLED = True
    settings.OTEL_TRACES_URL = receiver.url
    queue.queue_tree(root)
    started = time.perf_counter()
    sent, failed = sender.drain()
    seconds = time.perf_counter() - started
    ids = receiver.span_ids()
    receiver.stop()
    print(
        json.dumps(
            {
                "runs": args.runs,
                "spans": sent,
                "seconds": round(seconds, 2),
                "spans_per_s": sent / seconds,
                "failed_batches": failed,
                "exactly_once": len(ids) == len(set(ids)) == 2 * args.runs,
            }
        )
    )


if __name__ == "__main__":
    main()

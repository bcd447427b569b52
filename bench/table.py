"""The bench's figures: what each step measured, notes on the way, and the table printed
beside the targets."""

from __future__ import annotations

import platform
from pathlib import Path

results: dict = {}
notes: list[str] = []


def machine() -> str:
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    import os

    return f"{platform.machine()} {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def commit() -> str:
    """The code measured: its commit, with "+changes" when the work tree differs from it."""
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True)
        return done.stdout.decode().strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


TARGETS = [
    ("ingest_sqlite_events_per_s", ">=", 20000),
    ("ingest_sqlite_ratio", ">=", 0.35),
    ("ingest_postgres_events_per_s", None, None),
    ("ingest_postgres_ratio", None, None),
    # Against the driver's own bulk insert of the same rows, one transaction a frame.
    ("ingest_sqlite_driver_ratio", ">=", 0.5),
    ("ingest_postgres_driver_ratio", ">=", 0.4),
    # Usage rollups cost at most 15% of ingest (same frames, rollups on vs off).
    ("ingest_sqlite_rollup_ratio", ">=", 0.85),
    # Issue 33: a sandboxed start with its own network and the egress proxy; what the proxy
    # adds to one request to a local model endpoint.
    ("child_start_ms_p99_proxy", "<=", 100),
    ("egress_proxy_added_ms_p50", "<=", 5),
    ("push_p50_ms_one_process", None, None),
    ("push_p99_ms_one_process", "<=", 50),
    ("push_p50_ms_two_processes", None, None),
    ("push_p99_ms_two_processes", "<=", 100),
    ("subtree_ms", "<=", 300),
    ("subtree_queries", "<=", 6),
    ("tree_page_usable_ms", None, None),
    ("tree_page_usable_ms_100k", "<=", 2000),
    ("timeline_usable_ms_100k", "<=", 2000),
    ("tree_live_rows_per_s_100k", None, None),
    ("tree_live_applied_ratio_100k", ">=", 0.99),
    ("read_ratio", "<=", 1.5),
    ("memory_mb_1000_sockets", "<=", 300),
    # Issue 20: a budget stop reaches its runner within a second, Redis up or down.
    ("budget_stop_delivery_ms_redis_up", "<=", 1000),
    ("budget_stop_delivery_ms_redis_down", "<=", 1000),
    ("budget_overshoot_pct_redis_up", None, None),
    ("budget_overshoot_pct_redis_down", None, None),
    ("operator_cancel_delivery_ms_redis_up", "<=", 1000),
    ("operator_cancel_delivery_ms_redis_down", None, None),
    # Issue 27: export costs ingest at most 10%; a 10,000-run tree leaves within a minute.
    ("ingest_sqlite_trace_export_ratio", ">=", 0.9),
    ("trace_export_spans_per_s", None, None),
    ("trace_export_10k_runs_seconds", "<=", 60),
    # Issue 26 (bench.fleet): at 200 events/s actually sent, per-process fan-out.
    ("engines_postgres_latency_p50_ms", "<=", 15),
    ("engines_postgres_latency_p99_ms", "<=", 60),
    ("fleet_1p_20w_200r_process_push_p99_ms", "<=", 25),
    ("fleet_2p_20w_200r_process_push_p99_ms", "<=", 50),
    ("fleet_4p_200w_200r_process_push_p99_ms", "<=", 100),
    ("fleet_2p_20w_200r_process_doorbells_taken_per_event", "<=", 2),
    ("fleet_4p_200w_200r_process_doorbells_taken_per_event", "<=", 4),
    ("fleet_2p_20w_200r_process_live_reads_per_event_per_process", "<=", 1),
    ("fleet_4p_200w_200r_process_live_reads_per_event_per_process", "<=", 1),
    ("fleet10k_1s_50r_1p_answer_p99_ms", "<=", 250),
    # Issue 26 (bench.fleet10k): 10,000 agents on 1,000 runner sockets over two processes.
    ("fleet10k_1000s_10r_2p_answer_p99_ms", "<=", 250),
    # Issue 39: stored/s against the same run's one-process calibration (bench.fleet10k).
    ("fleet10k_1000s_10r_2p_stored_vs_calibration", ">=", 0.9),
    ("fleet10k_1000s_10r_2p_stored_vs_calibration_all_cores", None, None),
    ("fleet10k_1000s_10r_2p_refused", "<=", 0),
    ("fleet10k_1000s_10r_2p_unanswered_after_60s", "<=", 0),
    ("fleet10k_1000s_10r_2p_rss_mb_max_per_process", "<=", 1024),
]


def report():
    print(f"\nmachine: {results['machine']}")
    print(f"{'measure':36} {'value':>14}  target")
    # calibration_steps is each step's loop beside the figures it wrote: bench.json's, not the table's.
    shown = ("machine", "commit", "normalised", "calibration_steps")
    for key in sorted(k for k in results if k not in shown):
        target = next(((op, limit) for name, op, limit in TARGETS if name == key), (None, None))
        verdict, value = "", results[key]
        if target[0] and value is None:
            verdict = f"{target[0]} {target[1]}  NOT MEASURED"
        elif target[0]:
            ok = value >= target[1] if target[0] == ">=" else value <= target[1]
            verdict = f"{target[0]} {target[1]}  {'met' if ok else 'MISSED'}"
        # None: the step did not reach it (a ramp that never saw a busy answer, say).
        value = "-" if value is None else round(value, 2) if isinstance(value, float) else value
        value = " ".join(map(str, value)) if isinstance(value, list) else value
        print(f"{key:36} {value:>14}  {verdict}")
    for note in notes:
        print(f"note: {note}")

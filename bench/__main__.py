"""Run every measurement, print a table beside the targets, and write bench.json.

python -m bench                # everything
python -m bench ingest read    # a subset (``rollups``: only the rollups on/off comparison)

Each measure is its own module (``bench.ingest``, ``bench.read``, ``bench.push``,
``bench.memory``, ``bench.tree``, ``bench.budget_stop``, ``bench.mcp``, ``bench.sandbox``,
``bench.traces``, ``bench.fleet``, ``bench.fleet10k``); ``bench.table`` holds the figures. ``python -m bench.agents`` (the real pinned agent CLIs)
runs on its own, outside this list.
"""

from __future__ import annotations

import json
import sys
import time

from bench import budget_stop, calibrate, fleet, ingest, memory, push, read, sandbox, traces, tree
from bench.fleet10k import RAMP
from bench.servers import ROOT
from bench.table import commit, machine, notes, report, results

STEPS = {
    "ingest": lambda: (ingest.ingest("sqlite"), ingest.ingest("postgres"), ingest.ingest_rollups()),
    "rollups": ingest.ingest_rollups,
    "read": read.read,
    "push": push.push,
    "push1": push.push_one_process,
    "push2": push.push_two_processes,
    "memory": memory.memory,
    "tree": tree.tree,
    "mcp": lambda: results.update(
        {k: round(v, 2) for k, v in __import__("bench.mcp").mcp.measure().items()}
    ),
    "tree100k": tree.tree100k,
    "stop": budget_stop.stop,
    "sandbox": sandbox.measure,
    # Issue 27: trace export throughput, and ingest with export on vs off.
    "traces": traces.traces,
    "traces_export": traces.export_throughput,
    # Issue 28: a retention pass's rows/s, and ingest during it vs without.
    "retention": lambda: __import__("bench.retention").retention.retention(),
    "fleet": lambda: fleet.main([]),
    # Issue 26: an agent's stdout line to a live socket, on SQLite and on PostgreSQL + Redis.
    "engines": lambda: __import__("bench.engines").engines.both(),
    # Issue 26 item 4: 1,000 runner sockets x 10 runs at 1 event/s each, two processes; first
    # one process saturated at 100 sockets, the unit the step is held to, then a ramp of
    # rising rates on the same sockets, to find where back-pressure starts (issue 39).
    "fleet10k": lambda: __import__("bench.fleet10k").fleet10k.calibrated_fleet10k(),
    # The same with a keep-alive timer per socket, as before issue 39 (not a default step).
    "fleet10k_socket": lambda: __import__("bench.fleet10k").fleet10k.fleet10k(
        keepalive="socket", ramp=RAMP
    ),
    # One runner socket with 50 agents at 1,000 frames/s, grouped and frame by frame.
    "fleet_socket": lambda: __import__("bench.fleet10k").fleet10k.one_busy_socket(),
    # Approvals (issue 22): decision-to-tool latency on one and two processes, 200 waiting.
    "approvals": lambda: results.update(
        {k: round(v, 1) for k, v in __import__("bench.approvals").approvals.measure().items()}
    ),
}


DEFAULT_STEPS = [
    "ingest",
    "read",
    "push",
    "memory",
    "tree",
    "tree100k",
    "stop",
    "sandbox",
    "traces",
    "engines",
    "fleet",
    "fleet_socket",
    "fleet10k",
]


def main(argv: list[str]):
    wanted = argv or DEFAULT_STEPS
    results["machine"] = machine()
    results["commit"] = commit()
    # What this machine can do, first: the figures are compared through it (issue 39).
    calibrate.calibrate()
    for name in wanted:
        print(f"bench: {name} ...", flush=True)
        started = time.perf_counter()
        before = set(results)
        try:
            STEPS[name]()
        except Exception as exc:  # one broken step must not hide the others' figures
            notes.append(f"{name} failed: {exc}")
        print(f"bench: {name} took {time.perf_counter() - started:.1f}s", flush=True)
        calibrate.after_step(name, set(results) - before)
    calibrate.finish()
    # Written before the table is printed: a figure the table cannot show loses nothing.
    out = ROOT / "bench.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    report()
    print(f"wrote {out}")
    return 1 if any("failed" in n for n in notes) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

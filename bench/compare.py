"""Two runs of ``make bench`` side by side, through their calibration (issue 39): does each
live-path figure of one machine agree with the other's within 1.5x once normalised?

python -m bench.compare bench/records/A.json bench.json      # exit 1 if any figure disagrees

Each figure is held to the range the two runs' calibrations expect: a latency is CPU time plus
round trips, so one machine's over the other's lies between their loop ratio and their
PostgreSQL commit ratio (``expected``); a rate, the inverse. A figure agrees when its ratio is
within 1.5x of that range; the column ``cpu`` beside it gives the figure's step's CPU time
per unit of work, second over first (``step_cost_ratio``), for reading, not for the verdict.
Only the live path's figures (push, fleet, engines, approvals), and only those both runs
have. The bench's baselines (``BASELINES``: paths a deployment does not run, measured beside
the live path to show what it gained) are printed with their ratio but not held: the exit
status is the live path's alone.

Two latencies agree whatever their ratio when they are at most RESOLUTION_MS apart in wall
time. A step that ran over capacity in either run (its ``*_saturated`` figure) is held to its
throughput alone: its latencies measure the backlog the bench built in the step's seconds,
which grows with the step's length, not with the machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.calibrate import step_loop_ms

AGREE_WITHIN = 1.5
# Below a millisecond the bench cannot time an event: its own client is an asyncio loop on
# the same two cores, and a fan-out timed after the runner's answer is often a fraction of a
# millisecond, or negative (the watcher heard first), so a ratio of two of them means nothing.
RESOLUTION_MS = 1.0
LIVE_PATH = ("push", "fleet", "engines", "approval")
# The bench's baselines (docs/reference/settings.md): per-socket fan-out (LIVE_FANOUT=socket,
# with or without channels-redis's pub/sub layer), a keep-alive timer per runner socket, and
# a commit per frame (RUN_EVENT_GROUP_MAX=1). No deployment runs them unless it sets them.
BASELINES = ("_socket_", "_ungrouped_")
# CPU time per 1,000 deliveries: Python's work alone, so expected to follow the loop.
CPU_COST = "_cpu_ms_per_"


def comparable(run: dict) -> dict[str, float]:
    """The run's live-path figures both kinds of comparison apply to: latencies and rates."""
    return {
        key: value
        for key, value in run.items()
        if key.startswith(LIVE_PATH)
        and (key.endswith(("_per_s", "_ms")) or CPU_COST in key)
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    }


def is_baseline(key: str) -> bool:
    return any(mark in key for mark in BASELINES)


def expected(first: dict, second: dict, key: str) -> tuple[float, float]:
    """The range the second run's figure over the first's should lie in, from calibration.

    A latency is CPU time plus round trips, L = c * loop + r * commit (c, r >= 0), so the ratio
    of one machine's L to another's is a mediant of the loop ratio and the commit ratio: it
    lies between them, whatever the mix. A rate is the inverse of such a cost; CPU time per
    delivery follows the loop alone. The loop is the one measured around the figure's own step
    where the run has it (``calibration_steps``): a VM's speed wanders within a run."""
    ratios = []
    loops = step_loop_ms(first, key), step_loop_ms(second, key)
    if all(loops):
        ratios.append(loops[1] / loops[0])
    commit = "calibration_postgres_commit_ms"
    if CPU_COST not in key and first.get(commit) and second.get(commit):
        ratios.append(second[commit] / first[commit])
    ratios = sorted(ratios) or [1.0]
    low, high = ratios[0], ratios[-1]
    return (1 / high, 1 / low) if key.endswith("_per_s") else (low, high)


def steps(run: dict) -> dict[str, bool]:
    """Each step's key prefix (``fleet_2p_20w_200r_process_``) and whether it saturated."""
    return {
        key[: -len("saturated")]: value is True
        for key, value in run.items()
        if key.endswith("_saturated")
    }


def step_of(run: dict, key: str) -> str | None:
    """The prefix of the step ``key`` belongs to in ``run``: the longest that names one (a
    ramp's steps lie under the phase's own prefix), or None."""
    owners = [prefix for prefix in steps(run) if key.startswith(prefix)]
    return max(owners, key=len) if owners else None


def saturated_in(run: dict, key: str) -> bool:
    """Whether ``key`` is a latency of a step that saturated in ``run``."""
    prefix = step_of(run, key) if key.endswith("_ms") else None
    return prefix is not None and run[prefix + "saturated"] is True


def saturated_in_either(first: dict, second: dict, key: str) -> bool:
    return saturated_in(first, key) or saturated_in(second, key)


def step_cost(run: dict, key: str) -> float | None:
    """CPU time per unit of work in the step ``key`` belongs to: a fleet step's CPU per 1,000
    deliveries, a 1,000-socket phase's inverse of events stored per serving CPU second; or
    None."""
    prefix = step_of(run, key)
    if prefix is None:
        return None
    for name, inverse in (("cpu_ms_per_1000_delivered", False), ("stored_per_serving_cpu_s", True)):
        value = run.get(prefix + name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return 1 / value if inverse else value
    return None


def step_cost_ratio(first: dict, second: dict, key: str) -> float | None:
    """The second run's ``step_cost`` over the first's, or None. Printed beside each figure,
    not held: on the same code it is how much dearer the machine made the step's own work
    while it ran, which the calibration's loop, hot in the cache, can miss (issue 39: one EPYC
    VM spent 127-179 ms of CPU per 1,000 deliveries where another spent 103-109, at the same
    loop)."""
    a, b = step_cost(first, key), step_cost(second, key)
    return b / a if a and b else None


def compare(first: dict, second: dict) -> list[tuple[str, float, float, float]]:
    """(key, first, second, apart) for every figure both runs have and hold to each other,
    worst first: ``apart`` is how far the second's ratio to the first lies outside the range
    the calibration expects (1.0 inside it, or within RESOLUTION_MS in wall time)."""
    a, b = comparable(first), comparable(second)
    rows = []
    for key in sorted(a.keys() & b.keys()):
        if saturated_in_either(first, second, key):
            continue
        low, high = expected(first, second, key)
        if key.endswith("_ms") and abs(a[key] - b[key]) <= RESOLUTION_MS:
            apart = 1.0
        elif a[key] <= 0 or b[key] <= 0:
            apart = float("inf")
        else:
            ratio = b[key] / a[key]
            apart = ratio / high if ratio > high else low / ratio if ratio < low else 1.0
        rows.append((key, a[key], b[key], apart))
    return sorted(rows, key=lambda row: -row[3])


def held_to_throughput(first: dict, second: dict) -> list[str]:
    """The latencies both runs have that ``compare`` left out: their step saturated."""
    both = comparable(first).keys() & comparable(second).keys()
    return sorted(key for key in both if saturated_in_either(first, second, key))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    runs = [json.loads(Path(path).read_text()) for path in argv]
    for path, run in zip(argv, runs, strict=True):
        calibration = {
            k: v
            for k, v in run.items()
            if k.startswith("calibration_") and k != "calibration_steps"
        }
        print(f"{path}: {run.get('machine', '?')} at {run.get('commit', '?')}; {calibration}")
        if run.get("calibration_loop_spread", 1.0) > AGREE_WITHIN:
            print(
                f"note: {path}'s loop wandered {run['calibration_loop_spread']}x within the run;"
                " figures apart may be that machine's own unsteadiness"
            )
    rows = compare(*runs)
    if all(is_baseline(key) for key, *_ in rows):
        print("no live-path figure in both runs")
        return 1
    low, high = expected(*runs, "_ms")
    print(f"the calibration expects the second's latencies {low:.2f}-{high:.2f}x the first's")
    print(f"{'figure':60} {'first':>10} {'second':>10} {'apart':>6} {'cpu':>5}")
    for key, first, second, ratio in rows:
        verdict = "" if ratio <= AGREE_WITHIN else "  DISAGREE"
        verdict += "  (baseline, not held)" if is_baseline(key) else ""
        cost = step_cost_ratio(*runs, key)
        cost_text = "" if cost is None else f"{cost:5.2f}"
        print(f"{key:60} {first:10.2f} {second:10.2f} {ratio:6.2f} {cost_text:>5}{verdict}")
    held = [row for row in rows if not is_baseline(row[0])]
    apart = [row for row in held if row[3] > AGREE_WITHIN]
    baselines_apart = [row for row in rows if is_baseline(row[0]) and row[3] > AGREE_WITHIN]
    saturated = held_to_throughput(*runs)
    for key in saturated:
        print(f"{key:60} saturated: held to its step's throughput")
    print(
        f"{len(held) - len(apart)} of {len(held)} agree within {AGREE_WITHIN}x"
        f" ({len(saturated)} latencies of saturated steps held to their throughput;"
        f" {len(rows) - len(held)} baseline figures not held, {len(baselines_apart)} of them apart)"
    )
    return 1 if apart else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

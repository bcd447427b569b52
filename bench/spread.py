"""What a latency's spread over many runs follows (issue 39): the calibration, or the step's
own cost? Read-only, over records of the same code on several machines.

python -m bench.spread bench/records/2026-12-05-{epyc-d,xeon-c,xeon-d}-2core-?.json

For each default live-path latency (``bench.compare``'s figures, baselines and saturated
steps left out) that at least MIN_RUNS runs have: its spread (largest over smallest), and
what is left of it once the runs' differences in each candidate are fitted away. A fit is
least squares of log latency on log candidate, so it allows a power (a latency that queues
grows faster than the cost of the work in front of it); ``r`` is their correlation and
``left`` the spread of the residuals. The candidates are the calibration's loop around the
step (``bench.calibrate.step_loop_ms``) and the step's own CPU time per unit of work
(``bench.compare.step_cost``). The last line counts the figures whose spread,
as measured and as left by each fit, is within ``bench.compare.AGREE_WITHIN``: what a
calibration of that kind could at best make agree (a figure a candidate cannot be fitted to,
one whose step has no CPU measure, counts as measured).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from bench.calibrate import step_loop_ms
from bench.compare import AGREE_WITHIN, comparable, is_baseline, saturated_in, step_cost

MIN_RUNS = 4
CANDIDATES = ("loop", "cost")


def candidate(run: dict, key: str, name: str) -> float | None:
    return step_loop_ms(run, key) if name == "loop" else step_cost(run, key)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """(power, r, spread left) of ys on xs, both positive, fitted in logs."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    sxx = sum((x - mx) ** 2 for x in lx)
    if sxx == 0 or len(set(ly)) == 1:
        return 0.0, 0.0, math.exp(max(ly) - min(ly))
    power = sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / sxx
    left = [y - power * (x - mx) for x, y in zip(lx, ly, strict=True)]
    return power, statistics.correlation(lx, ly), math.exp(max(left) - min(left))


def latencies(runs: list[dict]) -> list[str]:
    """The latencies every comparison would hold in at least MIN_RUNS of the runs."""
    counts: dict[str, int] = {}
    for run in runs:
        for key in comparable(run):
            if key.endswith("_ms") and not is_baseline(key):
                counts[key] = counts.get(key, 0) + 1
    return sorted(
        key
        for key, count in counts.items()
        if count >= MIN_RUNS and not any(saturated_in(run, key) for run in runs)
    )


def spread(runs: list[dict], key: str) -> dict | None:
    """The figure's spread over the runs that have it, and each candidate's fit over those
    that have the candidate too (None where fewer than MIN_RUNS do)."""
    values = [comparable(run).get(key) for run in runs]
    found = [(run, value) for run, value in zip(runs, values, strict=True) if value and value > 0]
    if len(found) < MIN_RUNS:
        return None
    measured = [value for _run, value in found]
    out = {"runs": len(found), "spread": max(measured) / min(measured)}
    for name in CANDIDATES:
        pairs = [(candidate(run, key, name), value) for run, value in found]
        pairs = [(x, y) for x, y in pairs if x]
        out[name] = fit(*zip(*pairs, strict=True)) if len(pairs) >= MIN_RUNS else None
    return out


def main(argv: list[str]) -> int:
    runs = [json.loads(Path(path).read_text()) for path in argv]
    if len(runs) < MIN_RUNS:
        print(__doc__)
        return 2
    print(f"{'figure':56} {'runs':>4} {'spread':>6}" + "".join(f"  {n:>18}" for n in CANDIDATES))
    within = {"spread": 0, **dict.fromkeys(CANDIDATES, 0)}
    total = 0
    for key in latencies(runs):
        found = spread(runs, key)
        if found is None:
            continue
        total += 1
        within["spread"] += found["spread"] <= AGREE_WITHIN
        fits = ""
        for name in CANDIDATES:
            if found[name] is None:  # the step has no such measure (its cost, say)
                within[name] += found["spread"] <= AGREE_WITHIN
                fits += f"  {'-':>18}"
                continue
            power, r, left = found[name]
            within[name] += left <= AGREE_WITHIN
            fits += f"  ^{power:5.2f} r {r:5.2f} {left:5.2f}"
        print(f"{key:56} {found['runs']:>4} {found['spread']:6.2f}{fits}")
    print(
        f"of {total} latencies, spread within {AGREE_WITHIN}x: {within['spread']} as measured, "
        + ", ".join(f"{within[name]} once fitted to the {name}" for name in CANDIDATES)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

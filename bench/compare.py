"""Two runs of ``make bench`` side by side, through their calibration (issue 39): does each
live-path figure of one machine agree with the other's within 1.5x once normalised?

python -m bench.compare bench/records/A.json bench.json      # exit 1 if any figure disagrees

A latency (``*_ms``) is compared as a multiple of the round trip it stands on (``normalised``,
``bench.calibrate``); a rate (``*_per_s``) as events per loop time (the rate times
``calibration_loop_ms``: a machine whose Python runs slower is expected to store less). Only
the live path's figures (push, fleet, engines, approvals), and only those both runs have.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

AGREE_WITHIN = 1.5
LIVE_PATH = ("push", "fleet", "engines", "approval")


def comparable(run: dict) -> dict[str, float]:
    """The run's live-path figures, normalised."""
    figures = {}
    for key, value in run.get("normalised", {}).items():
        if key.startswith(LIVE_PATH):
            figures[key] = next(iter(value.values()))
    loop = run.get("calibration_loop_ms")
    for key, value in run.items():
        if key.startswith(LIVE_PATH) and key.endswith("_per_s") and loop:
            if isinstance(value, int | float) and value > 0:
                figures[key] = value * loop / 1000
    return figures


def compare(first: dict, second: dict) -> list[tuple[str, float, float, float]]:
    """(key, first, second, ratio) for every figure both runs have, worst first."""
    a, b = comparable(first), comparable(second)
    rows = []
    for key in sorted(a.keys() & b.keys()):
        low, high = sorted((a[key], b[key]))
        ratio = high / low if low > 0 else float("inf") if high > 0 else 1.0
        rows.append((key, a[key], b[key], ratio))
    return sorted(rows, key=lambda row: -row[3])


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    runs = [json.loads(Path(path).read_text()) for path in argv]
    for path, run in zip(argv, runs, strict=True):
        calibration = {k: v for k, v in run.items() if k.startswith("calibration_")}
        print(f"{path}: {run.get('machine', '?')} at {run.get('commit', '?')}; {calibration}")
    rows = compare(*runs)
    if not rows:
        print("no live-path figure in both runs")
        return 1
    print(f"{'figure (normalised)':60} {'first':>10} {'second':>10} {'ratio':>6}")
    for key, first, second, ratio in rows:
        verdict = "" if ratio <= AGREE_WITHIN else "  DISAGREE"
        print(f"{key:60} {first:10.2f} {second:10.2f} {ratio:6.2f}{verdict}")
    apart = [row for row in rows if row[3] > AGREE_WITHIN]
    print(f"{len(rows) - len(apart)} of {len(rows)} agree within {AGREE_WITHIN}x")
    return 1 if apart else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python -m bench.spread``: over many runs, what a live-path latency's spread follows, the
calibration's loop or the step's own CPU cost (issue 39)."""

from __future__ import annotations

import json

import pytest

from bench import spread

P99 = "fleet_1p_20w_200r_process_push_p99_ms"


def _run(loop_ms: float, cpu_ms: float, p99_ms: float) -> dict:
    return {
        "calibration_loop_ms": loop_ms,
        "fleet_1p_20w_200r_process_saturated": False,
        "fleet_1p_20w_200r_process_cpu_ms_per_1000_delivered": cpu_ms,
        P99: p99_ms,
        "engines_sqlite_latency_p99_ms": 3.0,  # no step cost: fitted to the loop alone
        "fleet_2p_20w_200r_socket_push_p99_ms": 9.0,  # a baseline: never read
        "tree_page_usable_ms": 400.0,  # not the live path: never read
    }


# The same loop everywhere; the step's work dearer on some runs, its latency the square of it
# (a queue): a spread of 4x that the loop cannot see and the cost explains entirely.
RUNS = [_run(80, cpu, 0.001 * cpu**2) for cpu in (100, 120, 150, 200)]


def test_it_fits_a_latency_that_grows_as_a_power_of_the_steps_cost():
    found = spread.spread(RUNS, P99)
    assert found["runs"] == 4 and found["spread"] == pytest.approx(4.0)
    power, r, left = found["cost"]
    assert power == pytest.approx(2.0) and r == pytest.approx(1.0) and left == pytest.approx(1.0)
    # The loop did not move: nothing to fit, the spread stays whole.
    assert found["loop"][2] == pytest.approx(4.0)


def test_it_reads_only_default_live_path_latencies_that_enough_runs_have():
    assert spread.latencies(RUNS) == ["engines_sqlite_latency_p99_ms", P99]
    assert spread.latencies(RUNS[:3]) == []  # fewer than MIN_RUNS
    saturated = [*RUNS[:3], {**RUNS[3], "fleet_1p_20w_200r_process_saturated": True}]
    assert spread.latencies(saturated) == ["engines_sqlite_latency_p99_ms"]


def test_it_counts_what_each_candidate_could_make_agree(tmp_path, capsys):
    paths = []
    for index, run in enumerate(RUNS):
        path = tmp_path / f"{index}.json"
        path.write_text(json.dumps(run))
        paths.append(str(path))
    assert spread.main(paths) == 0
    out = capsys.readouterr().out
    assert "of 2 latencies, spread within 1.5x: 1 as measured" in out
    assert "1 once fitted to the loop, 2 once fitted to the cost" in out
    assert spread.main(paths[:3]) == 2  # too few runs to say anything

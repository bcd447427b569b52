"""``python -m bench.compare``: two machines' runs agree when their live-path figures,
normalised by each run's calibration, are within 1.5x of each other (issue 39)."""

from __future__ import annotations

import json

from bench import calibrate, compare


def _run(loop_ms: float, pg_ms: float, push_p99_ms: float, stored_per_s: float) -> dict:
    run = {
        "machine": "x86_64 test",
        "calibration_loop_ms": loop_ms,
        "calibration_postgres_commit_ms": pg_ms,
        "fleet_1p_20w_200r_process_push_p99_ms": push_p99_ms,
        "fleet10k_1000s_10r_2p_events_stored_per_s": stored_per_s,
        "tree_page_usable_ms": 400.0,  # not the live path: never compared
    }
    run["normalised"] = calibrate.normalise(run)
    return run


def _main(tmp_path, first: dict, second: dict) -> int:
    """``python -m bench.compare`` on the two runs, written as bench.json files."""
    paths = []
    for name, run in (("a.json", first), ("b.json", second)):
        (tmp_path / name).write_text(json.dumps(run))
        paths.append(str(tmp_path / name))
    return compare.main(paths)


def test_it_agrees_when_a_slower_machine_is_slower_in_proportion(capsys):
    fast = _run(loop_ms=80, pg_ms=0.3, push_p99_ms=20, stored_per_s=8000)
    # Twice the round trip and half the Python speed: twice the latency, half the rate.
    slow = _run(loop_ms=160, pg_ms=0.6, push_p99_ms=40, stored_per_s=4000)
    rows = compare.compare(fast, slow)
    assert {key for key, *_ in rows} == {
        "fleet_1p_20w_200r_process_push_p99_ms",
        "fleet10k_1000s_10r_2p_events_stored_per_s",
    }
    assert all(ratio == 1.0 for *_, ratio in rows)


def test_it_names_a_figure_that_disagrees(tmp_path, capsys):
    first = _run(loop_ms=80, pg_ms=0.3, push_p99_ms=20, stored_per_s=8000)
    second = _run(loop_ms=80, pg_ms=0.3, push_p99_ms=61, stored_per_s=8000)
    assert _main(tmp_path, first, second) == 1
    out = capsys.readouterr().out
    assert "fleet_1p_20w_200r_process_push_p99_ms" in out and "DISAGREE" in out
    assert "1 of 2 agree" in out


def test_it_reports_the_baselines_without_holding_them(tmp_path, capsys):
    # Per-socket fan-out, a commit per frame, a keep-alive timer per socket: paths measured
    # beside the live path to show what it gained; a deployment runs none of them by default.
    baselines = (
        "fleet_2p_20w_200r_socket_pubsub_push_p50_ms",
        "fleet_4p_200w_50r_socket_push_p99_ms",
        "fleet10k_1s_50r_1p_ungrouped_answer_p99_ms",
        "fleet10k_1000s_10r_2p_socket_keepalive_answer_p99_ms",
    )
    first = _run(loop_ms=80, pg_ms=0.3, push_p99_ms=20, stored_per_s=8000)
    second = _run(loop_ms=80, pg_ms=0.3, push_p99_ms=20, stored_per_s=8000)
    for key in baselines:
        first[key], second[key] = 10.0, 40.0
    assert _main(tmp_path, first, second) == 0
    out = capsys.readouterr().out
    assert out.count("DISAGREE  (baseline, not held)") == 4
    assert "2 of 2 agree" in out and "4 baseline figures not held, 4 of them apart" in out
    # The default path apart still fails the comparison, baselines or not.
    second["fleet_1p_20w_200r_process_push_p99_ms"] = 61
    assert _main(tmp_path, first, second) == 1
    assert "1 of 2 agree" in capsys.readouterr().out


def test_it_prints_how_much_dearer_each_figures_step_made_its_own_work(tmp_path, capsys):
    step, phase = "fleet_1p_20w_200r_process_", "fleet10k_1000s_10r_2p_"
    first = _calibrated(80, 0.3, **{
        f"{step}saturated": False, f"{step}push_p99_ms": 10.0,
        f"{step}cpu_ms_per_1000_delivered": 100.0,
        f"{phase}saturated": False, f"{phase}events_stored_per_s": 8000.0,
        f"{phase}stored_per_serving_cpu_s": 5000.0,
    })  # fmt: skip
    second = {
        **first,
        f"{step}push_p99_ms": 20.0,
        f"{step}cpu_ms_per_1000_delivered": 160.0,
        f"{phase}stored_per_serving_cpu_s": 4000.0,
    }
    assert compare.step_cost_ratio(first, second, f"{step}push_p99_ms") == 1.6
    # Events per CPU second is the inverse of a cost: fewer of them, dearer work.
    assert compare.step_cost_ratio(first, second, f"{phase}events_stored_per_s") == 1.25
    assert compare.step_cost_ratio(first, second, "engines_sqlite_latency_p99_ms") is None
    # Printed beside the figure; the verdict stays the calibration's.
    assert _main(tmp_path, first, second) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(f"{step}push"))
    assert line.split()[1:5] == ["10.00", "20.00", "2.00", "1.60"] and "DISAGREE" in line


def _calibrated(loop_ms: float, pg_ms: float, **figures) -> dict:
    return {"calibration_loop_ms": loop_ms, "calibration_postgres_commit_ms": pg_ms, **figures}


def test_it_expects_a_ratio_between_the_loop_ratio_and_the_commit_ratio():
    # Python 1.25x slower, PostgreSQL round trips 0.8x: any mix of the two lies in between.
    first = _calibrated(80, 0.30, fleet_a_push_p99_ms=20.0, fleet_b_push_p99_ms=20.0)
    second = _calibrated(100, 0.24, fleet_a_push_p99_ms=26.0, fleet_b_push_p99_ms=40.0)
    first["fleet_d_push_p50_ms"], second["fleet_d_push_p50_ms"] = 20.0, 18.0  # in the range
    first["fleet_c_answered_per_s"], second["fleet_c_answered_per_s"] = 200.0, 140.0
    # CPU per delivery is Python's work: held to the loop ratio (1.25) alone.
    first["fleet_e_cpu_ms_per_1000_delivered"] = 100.0
    second["fleet_e_cpu_ms_per_1000_delivered"] = 100.0
    apart = {key: value for key, _, _, value in compare.compare(first, second)}
    assert round(apart["fleet_a_push_p99_ms"], 2) == 1.04  # 1.3x: 1.04x past 1.25, agrees
    assert round(apart["fleet_b_push_p99_ms"], 2) == 1.6  # 2x is 1.6x past the range
    assert round(apart["fleet_c_answered_per_s"], 2) == 1.14  # a rate: the inverse range
    assert apart["fleet_d_push_p50_ms"] == 1.0
    assert apart["fleet_e_cpu_ms_per_1000_delivered"] == 1.25


def test_it_holds_a_figure_to_the_loop_measured_around_its_own_step():
    # Same machine, same median loop; in the second run the fleet step ran while the VM was
    # 1.6x slower (its loop samples around the step), the push step at the usual speed.
    first = _calibrated(100, 0.10, fleet_a_push_p99_ms=10.0, push_p99_ms=5.0)
    second = _calibrated(100, 0.10, fleet_a_push_p99_ms=20.0, push_p99_ms=10.0)
    first["calibration_steps"] = {"fleet": {"loop_ms": 100.0, "figures": ["fleet_a_push_p99_ms"]}}
    second["calibration_steps"] = {
        "fleet": {"loop_ms": 160.0, "figures": ["fleet_a_push_p99_ms"]},
        "push": {"loop_ms": 100.0, "figures": ["push_p99_ms"]},
    }
    apart = {key: value for key, _, _, value in compare.compare(first, second)}
    assert round(apart["fleet_a_push_p99_ms"], 2) == 1.25  # 2x against 1.6x: agrees
    assert apart["push_p99_ms"] == 2.0  # 2x at the same speed: disagrees


def test_it_says_when_a_runs_machine_wandered_more_than_the_agreement_allows(tmp_path, capsys):
    steady = _run(loop_ms=80, pg_ms=0.3, push_p99_ms=20, stored_per_s=8000)
    wandering = {**steady, "calibration_loop_spread": 2.05}
    _main(tmp_path, steady, wandering)
    out = capsys.readouterr().out
    assert out.count("wandered") == 1 and "2.05x" in out


def test_it_agrees_on_latencies_a_millisecond_apart_whatever_their_ratio():
    first = _calibrated(80, 0.3, fleet_a_after_answer_p50_ms=-0.4, fleet_b_after_answer_p50_ms=0.5)
    second = _calibrated(80, 0.3, fleet_a_after_answer_p50_ms=0.5, fleet_b_after_answer_p50_ms=2.0)
    apart = {key: value for key, _, _, value in compare.compare(first, second)}
    assert apart["fleet_a_after_answer_p50_ms"] == 1.0
    assert apart["fleet_b_after_answer_p50_ms"] == 4.0  # 1.5 ms apart: the ratio counts


def test_it_holds_a_saturated_step_to_its_throughput(tmp_path, capsys):
    step = "fleet_4p_200w_200r_process_"
    phase = "fleet10k_1000s_10r_2p_"
    first = _calibrated(80, 0.3, **{
        f"{step}saturated": False, f"{step}push_p99_ms": 30.0, f"{step}answered_per_s": 199.0,
        f"{phase}saturated": True, f"{phase}answer_p99_ms": 5000.0,
        f"{phase}ramp_1000_saturated": False, f"{phase}ramp_1000_answer_p99_ms": 20.0,
    })  # fmt: skip
    second = _calibrated(80, 0.3, **{
        f"{step}saturated": True, f"{step}push_p99_ms": 3000.0, f"{step}answered_per_s": 170.0,
        f"{phase}saturated": True, f"{phase}answer_p99_ms": 9000.0,
        f"{phase}ramp_1000_saturated": False, f"{phase}ramp_1000_answer_p99_ms": 90.0,
    })  # fmt: skip
    compared = {key for key, *_ in compare.compare(first, second)}
    assert f"{step}answered_per_s" in compared and f"{step}push_p99_ms" not in compared
    assert f"{phase}answer_p99_ms" not in compared
    # The ramp's step under the saturated phase is its own: it did not saturate, so it counts.
    assert f"{phase}ramp_1000_answer_p99_ms" in compared
    assert _main(tmp_path, first, second) == 1
    out = capsys.readouterr().out
    assert f"{phase}ramp_1000_answer_p99_ms" in out and "DISAGREE" in out
    assert f"{step}push_p99_ms" in out and "saturated: held to its step's throughput" in out
    assert "1 of 2 agree" in out and "2 latencies of saturated steps" in out


def test_it_keeps_each_figures_median_over_the_windows():
    from bench.fleet import median_of

    windows = [
        {"push_p99_ms": 30.0, "delivered": 1000, "saturated": False, "layer": "core"},
        {"push_p99_ms": 90.0, "delivered": 990, "saturated": True, "layer": "core"},
        {"push_p99_ms": 40.0, "delivered": 1000, "saturated": False, "layer": "core"},
    ]
    figures = median_of(windows)
    assert figures["push_p99_ms"] == 40.0 and figures["delivered"] == 1000
    assert figures["saturated"] is True  # one window over capacity marks the step
    assert figures["push_p99_ms_windows"] == [30.0, 90.0, 40.0] and figures["windows"] == 3
    assert figures["layer"] == "core"


def test_it_adds_up_the_counts_of_a_busy_sockets_windows_and_keeps_their_tails():
    from bench.fleet import median_of

    windows = [
        {"answer_p99_ms": 14.0, "unanswered_after_60s": 0, "busy": 0},
        {"answer_p99_ms": 25.0, "unanswered_after_60s": 3, "busy": 2},
        {"answer_p99_ms": 11.0, "unanswered_after_60s": 0, "busy": 0},
    ]
    figures = median_of(windows, "answer_p99_ms", ("unanswered_after_60s", "busy"))
    assert figures["answer_p99_ms"] == 14.0
    # A frame left unanswered in any window counts: the median would have hidden it.
    assert figures["unanswered_after_60s"] == 3 and figures["busy"] == 2
    assert figures["answer_p99_ms_windows"] == [14.0, 25.0, 11.0]


def test_it_keeps_the_median_of_the_calibrations_taken_around_every_step(monkeypatch):
    from bench.table import results

    # The first loop measured while a previous run's servers were still stopping; the
    # machine's speed then wandered between steps.
    loops = iter([150.2, 101.4, 96.0, 104.8])
    commits = iter([(0.31, 2.5), (0.42, 0.9), (0.25, 0.7), (0.30, 0.6)])
    wakeups = iter([0.08, 0.35, 0.12, 0.2])
    monkeypatch.setattr(calibrate, "_loop_ms", lambda: next(loops))
    monkeypatch.setattr(calibrate, "_postgres_commit_ms", lambda: next(commits))
    monkeypatch.setattr(calibrate, "_redis_rtt_ms", lambda: 0.05)
    monkeypatch.setattr(calibrate, "_wakeup_p99_ms", lambda: next(wakeups))
    loads = iter([0.4, 5.1])  # before the first step; after the last (the bench's own)
    monkeypatch.setattr(calibrate, "_load_1m", lambda: next(loads))
    monkeypatch.setattr(calibrate, "_start", {})
    monkeypatch.setattr(calibrate, "_samples", {})
    saved = dict(results)
    try:
        results.clear()
        calibrate.calibrate()
        assert results["calibration_loop_ms"] == 150.2
        calibrate.after_step("ingest", {"ingest_events_per_s"})
        calibrate.after_step("fleet", {"fleet_push_p99_ms", "fleet_push_p50_ms"})
        assert results["calibration_loop_ms"] == 101.4  # median of 150.2, 101.4, 96.0
        calibrate.after_step("tree", set())
        calibrate.finish()
        assert results["calibration_loop_ms"] == 103.1  # the slow first sample outvoted
        assert results["calibration_loop_ms_samples"] == [150.2, 101.4, 96.0, 104.8]
        assert results["calibration_loop_spread"] == 1.56
        # Each step's loop: the mean of the samples just before and after it.
        assert results["calibration_steps"]["fleet"] == {
            "loop_ms": 98.7,
            "figures": ["fleet_push_p50_ms", "fleet_push_p99_ms"],
        }
        assert calibrate.step_loop_ms(results, "fleet_push_p99_ms") == 98.7
        assert calibrate.step_loop_ms(results, "ingest_events_per_s") == 125.8
        assert calibrate.step_loop_ms(results, "push_p99_ms") == 103.1  # no step: the median
        assert results["calibration_postgres_commit_ms"] == 0.305
        # Each figure on its own: the tail's median is of the tails, not of one measurement's.
        assert results["calibration_postgres_commit_p99_ms"] == 0.8
        assert results["calibration_wakeup_p99_ms"] == 0.16
        assert results["calibration_load_1m_before"] == 0.4
        assert results["calibration_load_1m"] == 5.1
    finally:
        results.clear()
        results.update(saved)


def test_it_records_the_commit_it_measured():
    import subprocess

    from bench.table import commit

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    assert commit().split("+")[0] == (head.stdout.strip() or "unknown")

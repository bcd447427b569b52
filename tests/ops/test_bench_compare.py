"""``python -m bench.compare``: two machines' runs agree when their live-path figures,
normalised by each run's calibration, are within 1.5x of each other (issue 39)."""

from __future__ import annotations

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
    paths = []
    for name, run in (("a.json", first), ("b.json", second)):
        (tmp_path / name).write_text(__import__("json").dumps(run))
        paths.append(str(tmp_path / name))
    assert compare.main(paths) == 1
    out = capsys.readouterr().out
    assert "fleet_1p_20w_200r_process_push_p99_ms" in out and "DISAGREE" in out
    assert "1 of 2 agree" in out


def test_it_records_the_commit_it_measured():
    import subprocess

    from bench.table import commit

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    assert commit().split("+")[0] == (head.stdout.strip() or "unknown")

"""What the machine the bench runs on can do, measured before the figures (issue 39): two runs
on two machines of one kind are compared through these, not through wall-clock figures alone.

Each is measured before the first step and after every step, and the median of those samples
kept; the loop's samples and their spread (slowest over fastest) are kept too
(``calibration_loop_ms_samples``, ``calibration_loop_spread``). A VM's speed wanders: on one
Intel VM the loop read 121 ms before the first step and after the last, and 90-108 ms in the
minutes between, so two samples at the ends stood for the machine no better than one.

- ``calibration_loop_ms``: a fixed single-core Python loop (the interpreter's speed here);
- ``calibration_postgres_commit_ms``: one INSERT and COMMIT round trip to PostgreSQL, p50;
- ``calibration_redis_rtt_ms``: one Redis PING round trip, p50;
- ``calibration_postgres_commit_p99_ms`` and ``calibration_wakeup_p99_ms`` (how late a 1 ms
  sleep wakes, p99): the machine's tail, recorded beside the figures' p99s. Two EPYC VMs with
  the same loop and round trips (within 5 %) differed 1.5-1.8x in some p99 latencies; these
  are kept so the next comparison can tell a jittery machine from a slower build;
- ``calibration_load_1m_before``: the 1-minute load average before the first step, what else
  the machine was doing as the bench began (a run started on a busy machine says so here);
- ``calibration_load_1m``: the same read at the end, right after the 1,000-socket step has kept
  every core busy: on 2 cores 4-6 is the bench's own load, not another program's;
- ``calibration_steal_pct``: the share of CPU time the hypervisor took (``/proc/stat`` steal)
  over the whole bench run.

``normalise`` then gives every latency figure (``*_ms``) as a multiple of the round trip it
stands on — PostgreSQL for ingest, push and fleet figures, the loop for the rest — in
``bench.json``'s ``normalised``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from bench.push import _percentile
from bench.servers import PG_ADMIN_URL
from bench.table import notes, results

LOOP = 2_000_000
ROUND_TRIPS = 300
WAKEUPS = 1000
_start: dict = {}
_samples: dict[str, list[float]] = {}


def _loop_ms() -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for i in range(LOOP):
            total += i * i
        best = min(best, (time.perf_counter() - started) * 1000)
    return best


def _postgres_commit_ms() -> tuple[float, float]:
    """p50 and p99."""
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=False) as conn:
        conn.execute("CREATE TEMP TABLE canopy_calibration (n int)")
        conn.commit()
        times = []
        for n in range(ROUND_TRIPS):
            started = time.perf_counter()
            conn.execute("INSERT INTO canopy_calibration VALUES (%s)", (n,))
            conn.commit()
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), _percentile(times, 0.99)


def _wakeup_p99_ms() -> float:
    """How much later than asked a 1 ms sleep returns, p99 over WAKEUPS sleeps."""
    late = []
    for _ in range(WAKEUPS):
        started = time.perf_counter()
        time.sleep(0.001)
        late.append((time.perf_counter() - started) * 1000 - 1)
    return _percentile(late, 0.99)


def _redis_rtt_ms() -> float:
    import redis

    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    times = []
    for _ in range(ROUND_TRIPS):
        started = time.perf_counter()
        client.ping()
        times.append((time.perf_counter() - started) * 1000)
    client.close()
    return statistics.median(times)


def _cpu_times() -> tuple[int, int]:
    """(total jiffies, steal jiffies) of all CPUs."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[7] if len(fields) > 7 else 0


def _measure_all() -> None:
    """One sample of each calibration figure; each figure is the median of its samples so far.

    Not the lowest, as before: a slow sample (PostgreSQL still writing out the step before) is
    outvoted by the others, and a machine slower for minutes at a time shows it."""
    for keys, measure, digits in (
        (("calibration_loop_ms",), _loop_ms, 1),
        (
            ("calibration_postgres_commit_ms", "calibration_postgres_commit_p99_ms"),
            _postgres_commit_ms,
            3,
        ),
        (("calibration_redis_rtt_ms",), _redis_rtt_ms, 3),
        (("calibration_wakeup_p99_ms",), _wakeup_p99_ms, 3),
    ):
        try:
            measured = measure()
        except Exception as exc:  # no server here: the figures that need it say so too
            notes.append(f"calibration: {keys[0]} not measured ({exc})")
            continue
        values = measured if isinstance(measured, tuple) else (measured,)
        for key, value in zip(keys, values, strict=True):
            _samples.setdefault(key, []).append(round(value, digits))
            results[key] = round(statistics.median(_samples[key]), digits)
    loop = _samples.get("calibration_loop_ms")
    if loop:
        results["calibration_loop_ms_samples"] = list(loop)
        results["calibration_loop_spread"] = round(max(loop) / min(loop), 2)


def _load_1m() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def calibrate() -> None:
    """The machine's round trips, measured first; the load and steal clocks start here."""
    _start["cpu"] = _cpu_times()
    results["calibration_load_1m_before"] = _load_1m()
    _measure_all()


def after_step(name: str, figures: set[str]) -> None:
    """Another sample, taken where nothing of the bench's runs, and the step's own loop: the
    mean of the samples just before and just after it, beside the figures it wrote
    (``calibration_steps``). On that Intel VM the loop's samples in one run went from 90 to
    165 ms, slowest for minutes at a time, so a figure is held to the speed of its own step."""
    _measure_all()
    loop = _samples.get("calibration_loop_ms", [])
    if len(loop) >= 2:
        steps = results.setdefault("calibration_steps", {})
        steps[name] = {
            "loop_ms": round((loop[-2] + loop[-1]) / 2, 1),
            "figures": sorted(key for key in figures if not key.startswith("calibration_")),
        }


def step_loop_ms(run: dict, key: str) -> float | None:
    """The loop of the step that wrote ``key``, else the run's median."""
    for step in run.get("calibration_steps", {}).values():
        if key in step["figures"]:
            return step["loop_ms"]
    return run.get("calibration_loop_ms")


def finish() -> None:
    """The load as the run ends and the CPU steal over the run (the last sample came after
    the last step), then every latency figure normalised."""
    results["calibration_load_1m"] = _load_1m()
    if "cpu" in _start:
        total0, steal0 = _start["cpu"]
        total1, steal1 = _cpu_times()
        if total1 > total0:
            results["calibration_steal_pct"] = round(100 * (steal1 - steal0) / (total1 - total0), 2)
    results["normalised"] = normalise(results)


ON_POSTGRES = ("ingest", "push", "fleet", "engines", "budget", "operator", "approval")


def normalise(figures: dict) -> dict:
    """Each ``*_ms`` figure as a multiple of its round trip (see the module's docstring)."""
    pg = figures.get("calibration_postgres_commit_ms")
    loop = figures.get("calibration_loop_ms")
    out = {}
    for key, value in figures.items():
        if key.startswith("calibration_") or not isinstance(value, int | float):
            continue
        if "_ms" not in key:
            continue
        base = pg if key.startswith(ON_POSTGRES) and pg else loop
        if base:
            unit = "x_postgres_commit" if base is pg else "x_loop"
            out[key] = {unit: round(value / base, 2)}
    return out

"""What the default sandbox costs a child start (issue 21): the time from spawning an agent
to its exit, for a program that does nothing (``/bin/true``), in the default bubblewrap
sandbox and with ``"sandbox": "none"``, through the runner's own ``process.spawn``.

The first sandboxed start of a root runner also pays the scan for root-only files in the
system paths (reported on its own); later starts take it from memory.

``python -m bench sandbox`` (part of ``make bench``'s table).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time

from bench.table import notes, results
from delegation.runner import process, sandbox
from delegation.runner.command import CommandPreset

STARTS = 40


async def _start_to_exit(preset: CommandPreset, workspace: str) -> float:
    home = sandbox.PrivateHome(preset) if preset.sandboxed else None
    try:
        started = time.perf_counter()
        child = await process.spawn(
            preset,
            ["/bin/true"],
            workspace=workspace,
            cwd=workspace,
            env={"PATH": "/usr/bin:/bin", "HOME": "/home/agent"},
            limit=2**16,
            home=home,
        )
        await child.communicate()
        return time.perf_counter() - started
    finally:
        if home is not None:
            home.remove()


def _percentiles(seconds: list[float]) -> tuple[float, float]:
    ms = sorted(s * 1000 for s in seconds)
    return statistics.median(ms), ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]


async def _measure() -> None:
    workspace = tempfile.mkdtemp(prefix="canopy-bench-sandbox-")
    try:
        for name, raw in (("bwrap", {}), ("none", {"sandbox": "none"})):
            preset = CommandPreset.from_config({"name": name, "command": ["true"], **raw})
            if preset.sandboxed and os.geteuid() == 0:
                sandbox._hidden.cache_clear()
                started = time.perf_counter()
                sandbox.warm_masks()
                results["sandbox_mask_scan_ms"] = round((time.perf_counter() - started) * 1000)
            times = [await _start_to_exit(preset, workspace) for _ in range(STARTS)]
            p50, p99 = _percentiles(times)
            results[f"child_start_ms_p50_{name}"] = round(p50, 1)
            results[f"child_start_ms_p99_{name}"] = round(p99, 1)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def measure() -> None:
    if not shutil.which("bwrap"):
        notes.append("sandbox: bwrap is not installed (apt-get install bubblewrap)")
        return
    asyncio.run(_measure())

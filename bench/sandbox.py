"""What containment costs a child (issues 21 and 33), through the runner's own ``process.spawn``:

- a start: spawning an agent that does nothing (``/bin/true``) to its exit, sandboxed with its
  own network and the egress proxy (the default), sandboxed on the runner's network (before
  issue 33), and unsandboxed;
- a model request: an HTTP GET to a local stand-in model endpoint, 200 times from inside one
  agent, on the runner's network (straight) and through the egress proxy (the bridge's
  loopback listener and the proxy's splice), p50 and p99 of each.

The first sandboxed start of a root runner also pays the scan for root-only files in the
system paths (reported on its own); later starts take it from memory.

``python -m bench sandbox`` (part of ``make bench``'s table).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.table import notes, results
from delegation.runner import process, sandbox, sandbox_masks
from delegation.runner.command import CommandPreset

STARTS = 40
REQUESTS = 200
# The agent of the request measure: REQUESTS GETs on one keep-alive-less connection each (as
# an SDK opening a fresh connection would), each timed; prints the milliseconds as JSON.
REQUESTER = """
import http.client, json, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
out = []
for _ in range(n):
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/v1/models")
    conn.getresponse().read()
    conn.close()
    out.append((time.perf_counter() - started) * 1000)
print(json.dumps(out))
"""


class _Model(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"data": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


async def _run(preset: CommandPreset, argv: list[str], workspace: str) -> tuple[float, bytes]:
    home = sandbox.PrivateHome(preset) if preset.sandboxed else None
    try:
        started = time.perf_counter()
        child = await process.spawn(
            preset,
            argv,
            workspace=workspace,
            cwd=workspace,
            env={"PATH": "/usr/bin:/bin", "HOME": "/home/agent"},
            limit=2**20,
            home=home,
        )
        out, _ = await child.communicate()
        return time.perf_counter() - started, out
    finally:
        if home is not None:
            home.remove()


def _percentiles(ms: list[float]) -> tuple[float, float]:
    ms = sorted(ms)
    return statistics.median(ms), ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]


def _preset(name: str, **raw) -> CommandPreset:
    return CommandPreset.from_config({"name": name, "command": ["true"], **raw})


async def _starts(workspace: str) -> None:
    modes = (
        ("proxy", _preset("proxy")),  # the default since issue 33
        ("bwrap", _preset("bwrap", network="host")),  # the default before it
        ("none", _preset("none", sandbox="none")),
    )
    if os.geteuid() == 0:
        sandbox_masks._scans.clear()
        started = time.perf_counter()
        sandbox_masks.warm_masks()
        results["sandbox_mask_scan_ms"] = round((time.perf_counter() - started) * 1000)
    for name, preset in modes:
        ms = [(await _run(preset, ["/bin/true"], workspace))[0] * 1000 for _ in range(STARTS)]
        p50, p99 = _percentiles(ms)
        results[f"child_start_ms_p50_{name}"] = round(p50, 1)
        results[f"child_start_ms_p99_{name}"] = round(p99, 1)


async def _requests(workspace: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    argv = ["/usr/bin/python3", "-I", "-c", REQUESTER, str(port), str(REQUESTS)]
    try:
        for name, preset in (
            ("straight", _preset("straight", network="host")),
            ("proxy", _preset("proxy", allowHosts=[f"127.0.0.1:{port}"])),
        ):
            _, out = await _run(preset, argv, workspace)
            ms = json.loads(out)[10:]  # the first few warm the interpreter and the path
            p50, p99 = _percentiles(ms)
            results[f"model_request_ms_p50_{name}"] = round(p50, 2)
            results[f"model_request_ms_p99_{name}"] = round(p99, 2)
        added = results["model_request_ms_p50_proxy"] - results["model_request_ms_p50_straight"]
        results["egress_proxy_added_ms_p50"] = round(added, 2)
    finally:
        server.shutdown()


async def _measure() -> None:
    workspace = tempfile.mkdtemp(prefix="canopy-bench-sandbox-")
    try:
        await _starts(workspace)
        if os.path.exists("/usr/bin/python3"):
            await _requests(workspace)
        else:
            notes.append("sandbox: no /usr/bin/python3 for the model-request measure")
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def measure() -> None:
    if not shutil.which("bwrap"):
        notes.append("sandbox: bwrap is not installed (apt-get install bubblewrap)")
        return
    asyncio.run(_measure())

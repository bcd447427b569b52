"""A real Arize Phoenix (``make phoenix`` installs it into .phoenix-venv), once per session.

``phoenix serve`` on free loopback ports, its working directory (SQLite database) in a temp
dir, telemetry off: the trace tests send it OTLP/HTTP and read the spans back through its own
REST API (``GET /v1/projects/{project}/spans``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest

from canopy.serving import free_port
from tests.support.paths import PROJECT

PHOENIX_BIN = PROJECT / ".phoenix-venv" / "bin" / "phoenix"


class Phoenix:
    def __init__(self, port: int, log_path):
        self.port = port
        self.log_path = log_path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def traces_url(self) -> str:
        return f"{self.base}/v1/traces"

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.base + path, timeout=10) as answer:
            return json.loads(answer.read())

    def spans(self, trace_hex: str, project: str = "default") -> list[dict]:
        """Every span of one trace Phoenix has stored, through its REST API (paged)."""
        found, cursor = [], None
        while True:
            query = f"/v1/projects/{project}/spans?limit=1000"
            if cursor:
                query += f"&cursor={cursor}"
            page = self.get(query)
            found.extend(s for s in page["data"] if s["context"]["trace_id"] == trace_hex)
            cursor = page.get("next_cursor")
            if not cursor:
                return found

    def wait_for_spans(self, trace_hex: str, count: int, timeout: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        spans: list[dict] = []
        while time.monotonic() < deadline:
            spans = self.spans(trace_hex)
            if len(spans) >= count:
                return spans
            time.sleep(0.25)
        raise AssertionError(f"Phoenix has {len(spans)} of {count} spans of trace {trace_hex}")


class _Process:
    """``phoenix serve`` started once per session: as soon as collection knows a trace test
    will run (``start_early``, from tests/tracing/conftest.py), so its boot (15-40 s on a
    loaded machine, mostly its own migrations) overlaps the tests before it."""

    server: Phoenix | None = None
    process: subprocess.Popen | None = None
    workdir = None


def start_early(workdir) -> None:
    if _Process.process is not None or not PHOENIX_BIN.exists():
        return
    port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    for name in list(env):
        if name.startswith("OTEL_"):
            env.pop(name)  # Phoenix instruments itself from these; not ours to pass on
    log_path = workdir / "phoenix.log"
    with open(log_path, "wb") as log:
        _Process.process = subprocess.Popen(
            [str(PHOENIX_BIN), "serve"], cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    _Process.server = Phoenix(port, log_path)
    _Process.workdir = workdir


def stop() -> None:
    process, _Process.process = _Process.process, None
    if process is None:
        return
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    shutil.rmtree(_Process.workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory):
    if not PHOENIX_BIN.exists():
        pytest.fail(f"{PHOENIX_BIN} is missing: run `make phoenix`")
    start_early(tmp_path_factory.mktemp("phoenix"))  # unless the conftest did already
    server, process = _Process.server, _Process.process
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(server.base + "/healthz", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            stop()
            pytest.fail("phoenix serve did not start:\n" + server.log_path.read_text()[-3000:])
        time.sleep(0.25)
    yield server
    stop()

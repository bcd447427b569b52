"""The real pinned agent CLIs under the reference runner, offline on the scripted model
endpoints the tests use: events/s from each agent's own output, and the latency from the model
stub sending a chunk to the event it becomes arriving on a live-socket subscriber.

python -m bench.agents                  # every agent, SQLite
python -m bench.agents claude codex     # a subset (names: see AGENTS)

Each agent's model makes ``CALLS`` turns, each a line of text carrying a marker (``mk007``)
then one call of a trivial Canopy MCP tool, then answers. Every chunk the
stub writes is stamped (its handler's socket writer is wrapped); the first live frame whose
event text holds a marker gives that marker's latency. Events/s is every event the subscriber
received over the span from its first to its last arrival. Not in ``make bench``'s default
list: it needs the CLIs ``make agents`` installs and takes minutes.
"""

# ruff: noqa: E402 - the test helpers below import models, so Django is set up first

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import django

from bench.engines import subscribe
from bench.servers import Database, Server

# The test helpers reused below import models; nothing here queries this process's database.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "canopy.settings")
django.setup()

from delegation.runner.acp import AcpEngine, AcpPreset
from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from delegation.runner.model_stub import ModelStub, Text, ToolCall
from tests.agents.test_codex import codex_preset
from tests.agents.test_copilot import copilot_preset
from tests.agents.test_gemini import gemini_preset
from tests.agents.test_gemini_acp import gemini_acp_preset
from tests.support.agents import claude_cli
from tests.support.agents.wire_stubs import GeminiStub, ResponsesStub
from tests.support.real_agents import offline_claude_preset

# Seconds a run may take before its row reports the timeout instead of a figure.
WAIT = int(os.environ.get("BENCH_AGENT_WAIT", "120"))
CALLS = 40  # >= 30 latency samples even if an agent folds a few markers together
MARK = re.compile(rb"mk(\d{3})")
TEXT_MARK = re.compile(r"mk(\d{3})")


SIDE_ANSWER = json.dumps(
    {
        "unproductive_state_analysis": "each step is new",
        "unproductive_state_confidence": 0.0,
        "reasoning": "each step is new",
        "confidence": 0.0,
    }
)


class Calls:
    """``CALLS`` turns of "a marked line of text, then one trivial Canopy tool", then an
    answer. The tool alternates between ``list_profiles`` and ``read_child`` of a child that
    does not exist (a quick refusal): Gemini CLI stops a run whose consecutive tool calls are
    identical as a loop."""

    def __call__(self, request):
        offered = request.tool_names
        tools = [
            next((t for t in offered if t.endswith(suffix)), None)
            for suffix in ("list_profiles", "read_child")
        ]
        if None in tools:
            # A CLI's side request (titles, summaries, routing); Gemini CLI's loop check
            # after 30 turns wants this JSON, and waits on anything else.
            return Text(SIDE_ANSWER)
        done = sum(1 for u in request.tool_uses if u.get("name") in tools)
        if done >= CALLS:
            return Text("all steps done")
        marker = f"step mk{done:03d}"
        if done % 2:
            return ToolCall(tools[1], {"childId": f"no-such-child-{done}"}, text=marker)
        return ToolCall(tools[0], {}, text=marker)


class _StampedWriter:
    """A handler's socket writer that records when each marker first left the stub."""

    def __init__(self, inner, sent: dict[int, int], lock: threading.Lock):
        self.inner, self.sent, self.lock = inner, sent, lock

    def write(self, data: bytes):
        written = self.inner.write(data)
        now = time.monotonic_ns()
        for found in MARK.finditer(bytes(data)):
            with self.lock:
                self.sent.setdefault(int(found[1]), now)
        return written

    def flush(self):
        return self.inner.flush()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def stamp(http_server) -> dict[int, int]:
    """Wrap every connection's writer of ``http_server`` (a stub's server); returns the
    marker -> send time (``time.monotonic_ns``, system-wide on Linux) it fills."""
    sent: dict[int, int] = {}
    lock = threading.Lock()
    base = http_server.RequestHandlerClass

    class Stamped(base):
        def setup(self):
            super().setup()
            self.wfile = _StampedWriter(self.wfile, sent, lock)

    http_server.RequestHandlerClass = Stamped
    return sent


def _home(scratch: Path, name: str) -> Path:
    return scratch / f"home-{name}"


def _claude(url: str, scratch: Path):
    config = offline_claude_preset(url, _home(scratch, "claude"))
    return CommandEngine([CommandPreset.from_config(config)], str(scratch))


def _command(preset_of):
    def make(url: str, scratch: Path):
        config = preset_of(url)
        return CommandEngine([CommandPreset.from_config(config)], str(scratch))

    return make


def _gemini_acp(url: str, scratch: Path):
    return AcpEngine([gemini_acp_preset(url)], str(scratch))


def _claude_acp(url: str, scratch: Path):
    # Claude Code refuses to skip permission prompts as root unless told it is sandboxed.
    env = claude_cli.offline_env(url, _home(scratch, "claude-acp"), IS_SANDBOX="1")
    preset = AcpPreset(
        "claude", [claude_cli.acp_bin()], env=env, allow_tool_kinds=("execute", "other")
    )
    return AcpEngine([preset], str(scratch))


# name -> (format shown in the table, stub class, engine factory, profile it runs)
AGENTS = {
    "claude": ("claude-stream-json", ModelStub, _claude, "claude"),
    "codex": ("codex-json", ResponsesStub, _command(codex_preset), "codex"),
    "gemini": ("gemini-stream-json", GeminiStub, _command(gemini_preset), "gemini"),
    "gemini-acp": ("acp (gemini --acp)", GeminiStub, _gemini_acp, "gemini"),
    "copilot": ("copilot-json", ModelStub, _command(copilot_preset), "copilot"),
    "claude-acp": ("acp (claude-agent-acp)", ModelStub, _claude_acp, "claude"),
}


def _pct(values: list[float], q: float) -> float:
    return round(values[int(q * (len(values) - 1))], 1)


async def measure_one(server: Server, token: str, api_token: str, name: str) -> dict:
    fmt, stub_class, make_engine, profile = AGENTS[name]
    # Under TMPDIR: run the bench with it pointing at a private directory.
    scratch = Path(tempfile.mkdtemp(prefix=f"canopy-bench-{name}-"))
    with stub_class(Calls()) as stub:
        sent = stamp(stub._server)
        engine = make_engine(stub.url, scratch)
        host = RunnerHost(f"{server.ws}/ws/runner/", token, engine, extension_id=f"b-{name}")
        arrivals: list[int] = []
        seen: dict[int, int] = {}
        kinds: dict[str, int] = {}
        errors: list[str] = []

        def on_events(now, events):
            for ev in events:
                arrivals.append(now)
                kinds[ev.get("kind", "?")] = kinds.get(ev.get("kind", "?"), 0) + 1
                if ev.get("kind") == "error" and len(errors) < 3:
                    errors.append(str(ev.get("error") or ev.get("text"))[:160])
                text = ev.get("text") or ""
                for found in TEXT_MARK.finditer(text):
                    seen.setdefault(int(found[1]), now)

        run_id = f"{name}-{time.time_ns()}"
        ready = asyncio.Event()
        async with host:
            watcher = asyncio.ensure_future(subscribe(server, api_token, run_id, on_events, ready))
            await asyncio.sleep(0)
            ctx = await host.open_root("Run the steps.", profile=profile, run_id=run_id)
            await host.wait(ctx.run_id, timeout=WAIT)
            await asyncio.sleep(1)
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    # The agents' homes and MCP configs (with their run tokens) go with the measurement.
    shutil.rmtree(scratch, ignore_errors=True)
    latencies = sorted((seen[k] - sent[k]) / 1e6 for k in seen if k in sent)
    out: dict = {"agent": name, "format": fmt, "events": len(arrivals), "kinds": kinds}
    if errors:  # shown so a figure cut short by an agent's own refusal says why
        out["errors"] = errors
    if len(arrivals) > 1:
        span = (arrivals[-1] - arrivals[0]) / 1e9
        out["seconds"] = round(span, 2)
        out["events_per_second"] = round(len(arrivals) / span, 1) if span else None
    out["latency_samples"] = len(latencies)
    if latencies:
        out["latency_p50_ms"] = round(statistics.median(latencies), 1)
        out["latency_p99_ms"] = _pct(latencies, 0.99)
        out["latency_max_ms"] = round(latencies[-1], 1)
    return out


def main(names: list[str]) -> list[dict]:
    wanted = names or list(AGENTS)
    unknown = [n for n in wanted if n not in AGENTS]
    if unknown:
        raise SystemExit(f"unknown agent(s) {unknown}; choose from {list(AGENTS)}")
    db = Database("sqlite")
    rows: list[dict] = []
    try:
        token = db.runner_token("agents")
        api_token = json.loads(db.python("bench.seed", "operator"))["apiToken"]
        server = Server(db)
        try:
            for name in wanted:
                started = time.perf_counter()
                try:
                    row = asyncio.run(measure_one(server, token, api_token, name))
                except Exception as exc:  # one broken CLI must not hide the others' figures
                    row = {"agent": name, "format": AGENTS[name][0], "error": repr(exc)[:300]}
                row["wall_seconds"] = round(time.perf_counter() - started, 1)
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            server.stop()
    finally:
        db.close()
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])

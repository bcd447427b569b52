"""Regenerate ``tests/support/agents/recorded/copilot-json/*`` from the pinned Copilot CLI.

``python -m tests.support.agents.record_copilot`` runs the real CLI (``copilot -p ...
--output-format json``, offline, on the scripted Anthropic endpoint) against the toy MCP
server and saves its stdout and its ``--usage-output-file``, so ``copilot-json`` is written
against what the CLI really prints. Paths, ports and the key are replaced by placeholders;
rerun after bumping the pin in the Makefile.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

from delegation.runner.model_stub import Fail, ModelStub, Steps, fixed
from tests.support.agents.other_clis import (
    STUB_KEY,
    agent_bin,
    copilot_env,
    private_home,
    run_cli,
)
from tests.support.agents.toy_mcp import ToyMCP

OUT = Path(__file__).resolve().parent / "recorded" / "copilot-json"


def _quote(request) -> str:
    return "The tool said: " + request.tool_result_text(request.tool_results[-1])


SCENARIOS = {
    "tool-call": (
        Steps("toy-echo", {"text": "hello canopy"}, answer=_quote, preface="Calling echo."),
        "Say hello through the echo tool.",
    ),
    "tool-error": (Steps("toy-fail", {"reason": "no such child"}, answer=_quote), "Fail."),
    "model-500": (fixed(Fail(500, "api_error", "scripted server error")), "Hi."),
}


def scrub(text: str, home: Path) -> str:
    text = text.replace(str(home), "/home/agent")
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
    return text.replace(STUB_KEY, "sk-REDACTED")


def record(name: str) -> tuple[int, float]:
    script, prompt = SCENARIOS[name]
    home = Path(tempfile.mkdtemp(prefix="copilot-rec-"))
    with ModelStub(script) as stub, ToyMCP() as toy:
        config = home / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"toy": {"type": "http", "url": toy.url}}}))
        usage = home / "usage.json"
        args = [agent_bin("copilot"), "-p", prompt, "--output-format", "json"]
        args += ["--allow-all-tools", "--additional-mcp-config", f"@{config}"]
        args += ["--usage-output-file", str(usage)]
        env = {**private_home(home), **copilot_env(stub.url)}
        run = run_cli(args, env, home / "work", timeout=180)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.jsonl").write_text("".join(scrub(x, home) + "\n" for x in run.lines))
    if usage.exists():
        (OUT / f"{name}.usage.json").write_text(scrub(usage.read_text(), home))
    return run.returncode, run.seconds


if __name__ == "__main__":
    for scenario in sys.argv[1:] or list(SCENARIOS):
        code, seconds = record(scenario)
        print(f"{scenario}: exit {code}, {seconds:.1f} s")

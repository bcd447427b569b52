"""Regenerate ``tests/support/agents/recorded/claude-stream-json/*.jsonl`` from the pinned CLI.

``python -m tests.support.agents.record_claude_stream`` runs the real Claude Code CLI against the
scripted model and the toy MCP server in a few scenarios and saves its stream-json output,
so the parser is written against what the CLI really prints. Machine paths, ports and the
stub key are replaced by fixed placeholders; rerun after bumping the CLI pin in the Makefile.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from delegation.runner.model_stub import Fail, ModelStub, Script, Steps, Text, ToolCall, fixed
from tests.support.agents.claude_cli import run_claude
from tests.support.agents.toy_mcp import ToyMCP

OUT = Path(__file__).resolve().parent / "recorded" / "claude-stream-json"


def _answer_with_result(request) -> str:
    return "The tool said: " + request.tool_result_text(request.tool_results[-1])


def _twice(request):
    # Two tool turns in a row, so --max-turns 1 stops the run with an error result.
    return ToolCall("mcp__toy__echo", {"text": f"turn {len(request.tool_results)}"})


SCENARIOS: dict[str, tuple[Script, list[str], list[str], str]] = {
    # name: (script, allowed tools, extra args, prompt)
    "tool-call": (
        Steps(
            "mcp__toy__echo",
            {"text": "hello canopy"},
            answer=_answer_with_result,
            preface="Calling the echo tool.",
        ),
        ["mcp__toy__echo"],
        [],
        "Say hello through the echo tool.",
    ),
    "tool-error": (
        Steps("mcp__toy__fail", {"reason": "no such child"}, answer=_answer_with_result),
        ["mcp__toy__fail"],
        [],
        "Call the fail tool.",
    ),
    "tool-permission-denied": (
        Steps("mcp__toy__fail", {"reason": "not allowed"}, answer="It was refused."),
        ["mcp__toy__echo"],
        [],
        "Call a tool you were not allowed.",
    ),
    "text-only": (fixed(Text("Just an answer, no tools.")), [], [], "Answer briefly."),
    "max-turns": (_twice, ["mcp__toy__echo"], ["--max-turns", "1"], "Loop on echo."),
    "model-400": (
        fixed(Fail(400, "invalid_request_error", "scripted bad request")),
        [],
        [],
        "Hi.",
    ),
    "model-500": (fixed(Fail(500, "api_error", "scripted server error")), [], [], "Hi."),
}


def scrub(text: str, home: Path, urls: list[str]) -> str:
    for path in {str(home.resolve()), str(home)}:
        # The CLI also names its project folder after the working directory, slashes as dashes.
        text = text.replace(path.replace("/", "-"), "-home-agent")
        text = text.replace(path, "/home/agent")
    for url in urls:
        text = text.replace(url, re.sub(r":\d+", ":PORT", url))
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
    return text.replace("sk-ant-stub-not-a-key", "sk-ant-REDACTED")


def record(name: str) -> tuple[int, float, int]:
    script, allowed, extra, prompt = SCENARIOS[name]
    with ModelStub(script) as stub, ToyMCP() as toy:
        home = Path(tempfile.mkdtemp(prefix="claude-rec-"))
        run = run_claude(
            prompt,
            model_url=stub.url,
            home=home,
            mcp_servers={"toy": {"type": "http", "url": toy.url}},
            allowed_tools=allowed,
            extra_args=extra,
            timeout=300,
        )
        lines = [scrub(line, home, [stub.url, toy.url]) for line in run.lines]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))
    return run.returncode, run.seconds, len(stub.turns)


if __name__ == "__main__":
    for scenario in sys.argv[1:] or list(SCENARIOS):
        code, seconds, turns = record(scenario)
        print(f"{scenario}: exit {code}, {seconds:.1f} s, {turns} model turns")

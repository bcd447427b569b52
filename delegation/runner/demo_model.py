"""``python -m delegation.runner.demo_model``: the scripted model behind ``make demo-agents``.

Real Claude Code grows a small tree offline with it: the root's model delegates two short
tasks through Canopy's ``delegate`` MCP tool, the first child delegates once more, and each run
then answers with what its children said. The review writes its notes with a shell command
first: a command that writes is not in the preset's ``--allowedTools``, so Claude Code asks
Canopy (``--permission-prompt-tool mcp__canopy__approve``) and the approval waits in the inbox
(issue 38: the demo showed none). Its own process on loopback (never part of the
server), on the port the demo presets' ``ANTHROPIC_BASE_URL`` names.
"""

from __future__ import annotations

import argparse
import re
import signal
import threading

from delegation.runner.model_stub import ModelRequest, ModelStub, Reply, Text, ToolCall

DELEGATE = "mcp__canopy__delegate"
SHELL = "Bash"
# A write, so it is asked for: Claude Code runs read-only commands (echo, ls) without asking.
REVIEW_NOTES = {
    "command": "echo 'The plan holds.' > review-notes.txt",
    "description": "Write the review notes to review-notes.txt",
}
DEFAULT_PORT = 8765
ROOT_MESSAGE = "[root] Grow a small demo tree"
# Each task's subtasks, by the tag its message starts with (tags, not words: the CLI adds its
# own text to the first message, and a tag cannot be mistaken for it).
PLAN = {
    "root": ["[survey] List the moving parts", "[review] Check the plan"],
    "survey": ["[detail] Describe one part"],
}


def task_of(request: ModelRequest) -> str:
    match = re.search(r"\[(root|survey|review|detail)\]", request.first_text)
    return match[1] if match else ""


def demo_script(request: ModelRequest) -> Reply:
    """One turn: delegate the next planned subtask not yet asked for, else answer."""
    if DELEGATE not in request.tool_names:
        return Text("ok")  # the CLI's side requests (titles, summaries)
    task = task_of(request)
    asked = [u.get("input", {}).get("message") for u in request.tool_uses]
    todo = [sub for sub in PLAN.get(task, []) if sub not in asked]
    if todo:
        arguments = {"profile": "claude", "message": todo[0], "waitSeconds": 50}
        return ToolCall(DELEGATE, arguments, text=f"{task or 'task'} delegating {todo[0]!r}.")
    if task == "review" and SHELL in request.tool_names:
        if not any(u.get("name") == SHELL for u in request.tool_uses):
            return ToolCall(SHELL, dict(REVIEW_NOTES), text="review writing its notes.")
    heard = [request.tool_result_text(r)[:80] for r in request.tool_results]
    said = "; ".join(heard) if heard else "nothing left to split"
    return Text(f"{task or 'task'} done ({said})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="on 127.0.0.1")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    with ModelStub(demo_script, port=args.port) as stub:
        print(f"Scripted demo model on {stub.url}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()

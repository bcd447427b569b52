"""A delegation tree for the trace tests, grown through the engine's real services.

Three levels, with tool calls, usage and a failed run::

    root (worker)              tool call "delegate" c-root-1 -> child A
      A (worker) via c-root-1  tool calls grep g-1 (ok), shell g-2 (failed), delegate c-a-1
        G (worker) via c-a-1   fails: "boom"
      B (reviewer), no tool call

Every message text, tool argument and result carries ``SECRET`` so a test can prove none of
it leaves without OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT.
"""

from __future__ import annotations

from dataclasses import dataclass

from delegation.runner_socket import methods
from tests.support.api import drive_runner, emit

SECRET = "SECRET-7f3a"


@dataclass
class TraceTree:
    root: str
    a: str
    g: str
    b: str
    spans: int = 11  # 4 runs + 4 tool calls + 3 usage reports (LLM spans)


def _usage(tokens_in, tokens_out, cost, model="claude-test-1", **more):
    data = {"inputTokens": tokens_in, "outputTokens": tokens_out, "costUsd": cost, "model": model}
    data.update(more)
    return {"kind": "usage", "input": data}


def _start(conn, parent, request_id, *, profile="worker", tool_call_id=None):
    params = {
        "runId": parent,
        "extensionId": "ext",
        "generation": 1,
        "request": {"requestId": request_id, "profile": profile, "message": f"task {SECRET}"},
    }
    if tool_call_id:
        params["toolCallId"] = tool_call_id
    return methods.child_start(conn, params)["runId"]


def build_trace_tree(name: str = "trace") -> TraceTree:
    conn = drive_runner(f"runner-{name}", host=f"host-{name}")
    root = f"{name}-root"
    methods.open_run(
        conn,
        {
            "conversationId": f"conv-{name}",
            "runId": root,
            "extensionId": "ext",
            "profile": "worker",
        },
    )
    emit(
        conn,
        root,
        [
            f"thinking about {SECRET}",
            {
                "kind": "tool-use",
                "toolName": "delegate",
                "toolCallId": "c-root-1",
                "input": {"task": SECRET},
            },
            _usage(1000, 200, 0.125, cacheReadTokens=300, cacheWriteTokens=40),
        ],
    )
    a = _start(conn, root, f"{name}-req-a", tool_call_id="c-root-1")
    emit(
        conn,
        a,
        [
            {"kind": "tool-use", "toolName": "grep", "toolCallId": "g-1", "input": {"q": SECRET}},
            {"kind": "tool-result", "toolCallId": "g-1", "toolOutput": [SECRET], "success": True},
            {"kind": "tool-use", "toolName": "shell", "toolCallId": "g-2", "input": SECRET},
            {"kind": "tool-result", "toolCallId": "g-2", "success": False, "error": SECRET},
            {"kind": "tool-use", "toolName": "delegate", "toolCallId": "c-a-1", "input": SECRET},
            _usage(50, 7, 0.0042),
        ],
    )
    g = _start(conn, a, f"{name}-req-g", tool_call_id="c-a-1")
    emit(conn, g, [_usage(10, 2, 0.001, model="claude-small")])
    methods.finish_run(conn, {"runId": g, "error": "boom"})
    emit(
        conn,
        a,
        [{"kind": "tool-result", "toolCallId": "c-a-1", "toolOutput": SECRET, "success": True}],
        start=7,
    )
    methods.finish_run(conn, {"runId": a, "output": f"done {SECRET}"})
    b = _start(conn, root, f"{name}-req-b", profile="reviewer")
    methods.finish_run(conn, {"runId": b, "output": SECRET})
    emit(
        conn,
        root,
        [{"kind": "tool-result", "toolCallId": "c-root-1", "toolOutput": SECRET, "success": True}],
        start=4,
    )
    methods.finish_run(conn, {"runId": root, "output": SECRET})
    return TraceTree(root, a, g, b)

"""The command engine's output formats: agents' own records → Canopy events and outcomes.

The records are in the shapes the CLIs document (Claude Code ``stream-json``, ``codex exec
--json``, Gemini CLI ``stream-json``); recorded Claude Code output, where a branch has it, is
parsed too.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from delegation.client import _check_event
from delegation.runner.formats import (
    FIELD_BYTES,
    FORMATS,
    ClaudeStreamJson,
    CodexJson,
    GeminiStreamJson,
    LinesFormat,
    make_format,
    read_lines,
)
from tests.support.paths import AGENTS

USAGE_KEYS = {
    "inputTokens",
    "outputTokens",
    "cacheReadTokens",
    "cacheWriteTokens",
    "costUsd",
    "model",
}


def feed_all(fmt, records) -> list[dict]:
    events = []
    for record in records:
        line = record if isinstance(record, str) else json.dumps(record)
        events.extend(fmt.feed(line))
    events.extend(fmt.flush())
    for ev in events:
        _check_event(ev)  # every event is one the SDK would send
    return events


def kinds(events) -> list[str]:
    return [ev["kind"] for ev in events]


# --- Claude Code --------------------------------------------------------------------------

CLAUDE_SESSION = [
    {
        "type": "system",
        "subtype": "init",
        "cwd": "/work/repo",
        "session_id": "0b1c6a4e-1111-4c2e-9c39-5b8e1b0d0a01",
        "tools": ["Task", "Bash", "Read", "mcp__canopy__delegate"],
        "mcp_servers": [{"name": "canopy", "status": "connected"}],
        "model": "claude-sonnet-4-5-20250929",
        "permissionMode": "bypassPermissions",
        "apiKeySource": "none",
    },
    {
        "type": "assistant",
        "message": {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": [
                {"type": "thinking", "thinking": "I should list the files.", "signature": "sig"},
                {"type": "text", "text": "Let me look around."},
                {
                    "type": "tool_use",
                    "id": "toolu_01A",
                    "name": "Bash",
                    "input": {"command": "ls", "description": "List files"},
                },
            ],
            "stop_reason": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        },
        "parent_tool_use_id": None,
        "session_id": "0b1c6a4e-1111-4c2e-9c39-5b8e1b0d0a01",
    },
    {
        "type": "user",
        "message": {
            "role": "user",
            "content": [
                {
                    "tool_use_id": "toolu_01A",
                    "type": "tool_result",
                    "content": "README.md\nsrc",
                    "is_error": False,
                }
            ],
        },
        "parent_tool_use_id": None,
        "session_id": "0b1c6a4e-1111-4c2e-9c39-5b8e1b0d0a01",
    },
    {
        "type": "assistant",
        "message": {
            "id": "msg_02",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_01B",
                    "name": "Read",
                    "input": {"file_path": "/work/repo/missing.py"},
                }
            ],
        },
        "parent_tool_use_id": None,
        "session_id": "0b1c6a4e-1111-4c2e-9c39-5b8e1b0d0a01",
    },
    {
        "type": "user",
        "message": {
            "role": "user",
            "content": [
                {
                    "tool_use_id": "toolu_01B",
                    "type": "tool_result",
                    "content": [{"type": "text", "text": "<tool_use_error>File does not exist."}],
                    "is_error": True,
                }
            ],
        },
        "parent_tool_use_id": None,
        "session_id": "0b1c6a4e-1111-4c2e-9c39-5b8e1b0d0a01",
    },
    {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "duration_ms": 5120,
        "duration_api_ms": 4800,
        "num_turns": 3,
        "result": "The repo has a README and src.",
        "session_id": "0b1c6a4e-1111-4c2e-9c39-5b8e1b0d0a01",
        "total_cost_usd": 0.0123,
        "usage": {
            "input_tokens": 1200,
            "cache_creation_input_tokens": 300,
            "cache_read_input_tokens": 4000,
            "output_tokens": 210,
            "server_tool_use": {"web_search_requests": 0},
            "service_tier": "standard",
        },
        "modelUsage": {"claude-sonnet-4-5-20250929": {"inputTokens": 1200}},
        "permission_denials": [],
    },
]


def test_it_maps_every_claude_record_type():
    fmt = ClaudeStreamJson()
    events = feed_all(fmt, CLAUDE_SESSION)
    assert kinds(events) == [
        "session",
        "thinking",
        "text",
        "tool-use",
        "tool-result",
        "tool-use",
        "tool-result",
        "usage",
        "result",
    ]
    session, thinking, text, use, ok, use2, failed, usage, result = events
    assert session["input"]["model"] == "claude-sonnet-4-5-20250929"
    assert session["input"]["mcpServers"] == [{"name": "canopy", "status": "connected"}]
    assert thinking["text"] == "I should list the files."
    assert text["text"] == "Let me look around."
    assert use == {
        "kind": "tool-use",
        "toolName": "Bash",
        "toolCallId": "toolu_01A",
        "input": {"command": "ls", "description": "List files"},
    }
    assert ok["toolCallId"] == "toolu_01A" and ok["toolName"] == "Bash"
    assert ok["success"] is True and ok["toolOutput"] == "README.md\nsrc"
    assert "error" not in ok
    assert use2["toolCallId"] == failed["toolCallId"] == "toolu_01B"
    assert failed["success"] is False
    assert failed["error"] == "<tool_use_error>File does not exist."
    assert result["text"] == "The repo has a README and src."
    assert usage["input"] == {
        "inputTokens": 1200,
        "outputTokens": 210,
        "cacheReadTokens": 4000,
        "cacheWriteTokens": 300,
        "costUsd": 0.0123,
        "model": "claude-sonnet-4-5-20250929",
    }
    outcome = fmt.outcome(0)
    assert outcome.output == "The repo has a README and src." and outcome.error is None


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        (
            {"subtype": "error_max_turns", "is_error": False, "num_turns": 2},
            "the agent reached its turn limit",
        ),
        (
            {"subtype": "error_during_execution", "is_error": True, "errors": ["API down"]},
            "API down",
        ),
        (
            {"subtype": "success", "is_error": True, "result": "Credit balance is too low"},
            "Credit balance is too low",
        ),
        ({"subtype": "error_something_new", "is_error": True}, "error_something_new"),
    ],
)
def test_it_fails_a_claude_run_with_the_agents_reason(result, reason):
    fmt = ClaudeStreamJson()
    record = {
        "type": "result",
        "total_cost_usd": 0.5,
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    events = feed_all(fmt, [{**record, **result}])
    assert kinds(events) == ["usage", "error"]
    assert reason in events[1]["error"]
    assert events[0]["input"]["costUsd"] == 0.5
    # The exit status does not hide the agent's own reason, whatever it is.
    for code in (0, 1):
        outcome = fmt.outcome(code)
        assert outcome.output is None and reason in outcome.error


def test_it_counts_each_turn_of_a_claude_conversation_once():
    # Fed through --input-format stream-json, Claude Code ends every turn with a result whose
    # total_cost_usd is the session's running total and whose usage is the turn's own.
    fmt = ClaudeStreamJson()
    turn = {"type": "result", "usage": {"input_tokens": 10, "output_tokens": 2}}
    first = feed_all(
        fmt,
        [
            {
                **turn,
                "subtype": "error_during_execution",
                "is_error": True,
                "result": "tool broke",
                "total_cost_usd": 0.25,
            }
        ],
    )
    assert fmt.turns_ended == 1 and fmt.outcome(0).error == "tool broke"
    second = feed_all(
        fmt,
        [
            {
                **turn,
                "subtype": "success",
                "is_error": False,
                "result": "fixed after the steer",
                "total_cost_usd": 0.75,
            }
        ],
    )
    assert fmt.turns_ended == 2
    costs = [e["input"]["costUsd"] for e in first + second if e["kind"] == "usage"]
    assert costs == [0.25, 0.5]
    assert fmt.outcome(0).output == "fixed after the steer" and fmt.outcome(0).error is None


def test_it_shows_a_long_claude_tool_calls_heartbeat_as_an_update_of_that_call():
    fmt = ClaudeStreamJson()
    use = {
        "type": "assistant",
        "message": {
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_9",
                    "name": "mcp__canopy__delegate",
                    "input": {"profile": "claude"},
                }
            ]
        },
    }
    beat = {
        "type": "tool_progress",
        "tool_use_id": "toolu_9-heartbeat-0",
        "tool_name": "mcp__canopy__delegate",
        "parent_tool_use_id": None,
        "elapsed_time_seconds": 30,
        "uuid": "u",
        "session_id": "s",
    }
    events = feed_all(fmt, [use, beat])
    assert [e["kind"] for e in events] == ["tool-use", "tool-update"]
    assert events[1]["toolCallId"] == "toolu_9" and events[1]["text"] == "running for 30 s"
    assert events[1]["toolName"] == "mcp__canopy__delegate"


def test_it_attaches_claude_subagent_records_to_the_task_call_that_made_them():
    sid = "s-1"
    records = [
        {
            "type": "assistant",
            "message": {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_task",
                        "name": "Task",
                        "input": {"description": "explore", "prompt": "Find the tests"},
                    }
                ],
            },
            "parent_tool_use_id": None,
            "session_id": sid,
        },
        {
            "type": "user",
            "message": {"role": "user", "content": [{"type": "text", "text": "Find the tests"}]},
            "parent_tool_use_id": "toolu_task",
            "session_id": sid,
        },
        {
            "type": "assistant",
            "message": {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Searching."},
                    {
                        "type": "tool_use",
                        "id": "toolu_sub",
                        "name": "Glob",
                        "input": {"pattern": "tests/**"},
                    },
                ],
            },
            "parent_tool_use_id": "toolu_task",
            "session_id": sid,
        },
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_sub", "content": "tests/a.py"}
                ],
            },
            "parent_tool_use_id": "toolu_task",
            "session_id": sid,
        },
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_task",
                        "content": [{"type": "text", "text": "tests/a.py is the only test"}],
                    }
                ],
            },
            "parent_tool_use_id": None,
            "session_id": sid,
        },
    ]
    fmt = ClaudeStreamJson()
    events = feed_all(fmt, records)
    assert [(e["kind"], e.get("toolCallId")) for e in events] == [
        ("tool-use", "toolu_task"),
        ("user", "toolu_task"),
        ("text", "toolu_task"),
        ("tool-use", "toolu_task/toolu_sub"),
        ("tool-result", "toolu_task/toolu_sub"),
        ("tool-result", "toolu_task"),
    ]
    assert events[4]["toolName"] == "Glob" and events[4]["success"] is True
    # A subagent's text is not the run's answer.
    assert fmt.last_text is None


def test_it_shows_claude_partial_messages_as_deltas_and_other_system_records():
    fmt = ClaudeStreamJson()
    events = feed_all(
        fmt,
        [
            {
                "type": "stream_event",
                "event": {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "Hel"},
                },
                "parent_tool_use_id": None,
            },
            {"type": "stream_event", "event": {"type": "message_stop"}},
            {
                "type": "system",
                "subtype": "compact_boundary",
                "compact_metadata": {"trigger": "auto"},
            },
        ],
    )
    assert kinds(events) == ["text-delta", "system"]
    assert events[0]["text"] == "Hel"
    assert events[1]["input"] == {"compact_metadata": {"trigger": "auto"}}


def test_it_parses_recorded_claude_code_output():
    recorded = AGENTS / "recorded" / "claude-stream-json"
    files = sorted(recorded.glob("*.jsonl"))
    # The recordings ship with the tests (tests/support/agents/record_claude_stream.py makes them anew).
    assert files, f"no recorded Claude Code output in {recorded}"
    names = [f.name for f in files]
    texts = [f.read_text() for f in files]
    by_name = dict(zip(names, texts, strict=True))
    if "tool-call.jsonl" in by_name:
        fmt = ClaudeStreamJson()
        events = feed_all(
            fmt, [line for line in by_name["tool-call.jsonl"].splitlines() if line.strip()]
        )
        use = next(e for e in events if e["kind"] == "tool-use")
        done = next(e for e in events if e["kind"] == "tool-result")
        assert use["toolCallId"] == done["toolCallId"] and done["success"] is True
        usage = next(e for e in events if e["kind"] == "usage")["input"]
        assert usage["costUsd"] > 0 and usage["inputTokens"] > 0 and usage["model"]
        assert fmt.outcome(0).output == next(e for e in events if e["kind"] == "result")["text"]
    if "max-turns.jsonl" in by_name:
        fmt = ClaudeStreamJson()
        feed_all(fmt, [line for line in by_name["max-turns.jsonl"].splitlines() if line.strip()])
        assert "maximum number of turns" in fmt.outcome(1).error
    if "tool-permission-denied.jsonl" in by_name:
        lines = by_name["tool-permission-denied.jsonl"].splitlines()
        events = feed_all(ClaudeStreamJson(), [line for line in lines if line.strip()])
        denied = next(e for e in events if e["kind"] == "permission")
        assert denied["success"] is False and denied["toolCallId"].startswith("toolu_")
    if "model-400.jsonl" in by_name:
        lines = by_name["model-400.jsonl"].splitlines()
        events = feed_all(ClaudeStreamJson(), [line for line in lines if line.strip()])
        usage = next(e for e in events if e["kind"] == "usage")["input"]
        assert usage.get("model") != "<synthetic>"
    for text in texts:
        fmt = ClaudeStreamJson()
        lines = [line for line in text.splitlines() if line.strip()]
        events = feed_all(fmt, lines)
        # Every record is understood: nothing fell back to a raw text line.
        raw = [
            e for e in events if e["kind"] == "text" and e.get("text", "").lstrip().startswith("{")
        ]
        assert raw == []
        assert "result" in kinds(events) or "error" in kinds(events)
        assert any(e["kind"] == "usage" for e in events)


# --- Codex --------------------------------------------------------------------------------

CODEX_SESSION = [
    {"type": "thread.started", "thread_id": "0199a213-81c0-7800-8aa1-bbab2a035a53"},
    {"type": "turn.started"},
    {
        "type": "item.completed",
        "item": {"id": "item_0", "type": "reasoning", "text": "**Scanning**"},
    },
    {
        "type": "item.started",
        "item": {
            "id": "item_1",
            "type": "command_execution",
            "command": "bash -lc ls",
            "aggregated_output": "",
            "exit_code": None,
            "status": "in_progress",
        },
    },
    {
        "type": "item.updated",
        "item": {
            "id": "item_1",
            "type": "command_execution",
            "command": "bash -lc ls",
            "aggregated_output": "docs\n",
            "exit_code": None,
            "status": "in_progress",
        },
    },
    {
        "type": "item.completed",
        "item": {
            "id": "item_1",
            "type": "command_execution",
            "command": "bash -lc ls",
            "aggregated_output": "docs\nsrc\n",
            "exit_code": 0,
            "status": "completed",
        },
    },
    {
        "type": "item.completed",
        "item": {
            "id": "item_2",
            "type": "command_execution",
            "command": "bash -lc 'pytest'",
            "aggregated_output": "1 failed",
            "exit_code": 1,
            "status": "failed",
        },
    },
    {
        "type": "item.completed",
        "item": {
            "id": "item_3",
            "type": "file_change",
            "changes": [{"path": "/w/src/app.py", "kind": "update"}],
            "status": "completed",
        },
    },
    {
        "type": "item.started",
        "item": {
            "id": "item_4",
            "type": "mcp_tool_call",
            "server": "canopy",
            "tool": "delegate",
            "arguments": {"profile": "worker", "message": "fix it"},
            "status": "in_progress",
        },
    },
    {
        "type": "item.completed",
        "item": {
            "id": "item_4",
            "type": "mcp_tool_call",
            "server": "canopy",
            "tool": "delegate",
            "arguments": {"profile": "worker", "message": "fix it"},
            "result": {"content": [{"type": "text", "text": "ok"}], "structured_content": None},
            "error": None,
            "status": "completed",
        },
    },
    {
        "type": "item.completed",
        "item": {
            "id": "item_5",
            "type": "mcp_tool_call",
            "server": "canopy",
            "tool": "delegate",
            "arguments": {},
            "error": {"message": "depth limit reached"},
            "status": "failed",
        },
    },
    {
        "type": "item.started",
        "item": {"id": "item_6", "type": "web_search", "query": "asyncio readline limit"},
    },
    {
        "type": "item.completed",
        "item": {"id": "item_6", "type": "web_search", "query": "asyncio readline limit"},
    },
    {
        "type": "item.started",
        "item": {
            "id": "item_7",
            "type": "todo_list",
            "items": [{"text": "read", "completed": True}, {"text": "fix", "completed": False}],
        },
    },
    {
        "type": "item.completed",
        "item": {"id": "item_8", "type": "error", "message": "model rerouted"},
    },
    {
        "type": "item.completed",
        "item": {"id": "item_9", "type": "agent_message", "text": "Fixed the bug."},
    },
    {
        "type": "turn.completed",
        "usage": {"input_tokens": 24763, "cached_input_tokens": 24448, "output_tokens": 122},
    },
]


def test_it_maps_every_codex_record_type():
    fmt = CodexJson()
    events = feed_all(fmt, CODEX_SESSION)
    assert kinds(events) == [
        "session",
        "turn",
        "thinking",
        "tool-use",
        "tool-update",
        "tool-result",
        "tool-use",
        "tool-result",
        "tool-use",
        "tool-result",
        "tool-use",
        "tool-result",
        "tool-use",
        "tool-result",
        "tool-use",
        "tool-result",
        "plan",
        "error",
        "text",
        "usage",
    ]
    by_id: dict[str, list[dict]] = {}
    for ev in events:
        if "toolCallId" in ev:
            by_id.setdefault(ev["toolCallId"], []).append(ev)
    shell = by_id["item_1"]
    assert shell[0]["toolName"] == "shell" and shell[0]["input"] == {"command": "bash -lc ls"}
    assert shell[1]["toolOutput"] == "docs\n"
    assert shell[2]["success"] is True and shell[2]["toolOutput"] == "docs\nsrc\n"
    assert by_id["item_2"][1]["success"] is False and by_id["item_2"][1]["error"] == "exit code 1"
    assert by_id["item_3"][0]["toolName"] == "file_change" and by_id["item_3"][1]["success"] is True
    mcp = by_id["item_4"]
    assert [e["kind"] for e in mcp] == ["tool-use", "tool-result"]  # started once, not twice
    assert mcp[0]["toolName"] == "mcp__canopy__delegate"
    assert mcp[0]["input"] == {"profile": "worker", "message": "fix it"}
    assert mcp[1]["success"] is True
    assert by_id["item_5"][1]["success"] is False
    assert by_id["item_5"][1]["error"] == "depth limit reached"
    assert by_id["item_6"][0]["input"] == {"query": "asyncio readline limit"}
    plan = events[16]
    assert plan["text"] == "[x] read\n[ ] fix"
    assert events[17]["error"] == "model rerouted"
    assert events[-1]["input"] == {
        "inputTokens": 24763,
        "outputTokens": 122,
        "cacheReadTokens": 24448,
    }
    assert fmt.outcome(0).output == "Fixed the bug."


def test_it_fails_a_codex_run_on_turn_failed_and_keeps_stream_errors():
    fmt = CodexJson()
    events = feed_all(
        fmt,
        [
            {"type": "thread.started", "thread_id": "t"},
            {"type": "turn.started"},
            {"type": "error", "message": "Reconnecting... 1/5"},
            {"type": "turn.failed", "error": {"message": "stream disconnected before completion"}},
        ],
    )
    assert kinds(events) == ["session", "turn", "error", "error"]
    outcome = fmt.outcome(1)
    assert outcome.error == "stream disconnected before completion"
    # Without turn.failed, a non-zero exit names the last error the agent printed.
    fmt = CodexJson()
    feed_all(fmt, [{"type": "error", "message": "unauthorized"}])
    assert fmt.outcome(1).error == "exit status 1: unauthorized"


# --- Gemini CLI ---------------------------------------------------------------------------

GEMINI_SESSION = [
    {
        "type": "init",
        "timestamp": "2025-10-10T12:00:00.000Z",
        "session_id": "g-1",
        "model": "gemini-2.5-pro",
    },
    {"type": "message", "timestamp": "t", "role": "user", "content": "List the files"},
    {"type": "message", "timestamp": "t", "role": "assistant", "content": "I'll ", "delta": True},
    {"type": "message", "timestamp": "t", "role": "assistant", "content": "look.", "delta": True},
    {
        "type": "tool_use",
        "timestamp": "t",
        "tool_name": "list_directory",
        "tool_id": "list_directory-1760-abc",
        "parameters": {"dir_path": "."},
    },
    {
        "type": "tool_result",
        "timestamp": "t",
        "tool_id": "list_directory-1760-abc",
        "status": "success",
        "output": "Listed 2 item(s).",
    },
    {
        "type": "tool_use",
        "timestamp": "t",
        "tool_name": "read_file",
        "tool_id": "rf-2",
        "parameters": {"path": "x"},
    },
    {
        "type": "tool_result",
        "timestamp": "t",
        "tool_id": "rf-2",
        "status": "error",
        "output": "",
        "error": {"type": "FILE_NOT_FOUND", "message": "File not found: x"},
    },
    {
        "type": "error",
        "timestamp": "t",
        "severity": "warning",
        "message": "Loop detected, stopping",
    },
    {
        "type": "message",
        "timestamp": "t",
        "role": "assistant",
        "content": "There are ",
        "delta": True,
    },
    {
        "type": "message",
        "timestamp": "t",
        "role": "assistant",
        "content": "two files.",
        "delta": True,
    },
    {
        "type": "result",
        "timestamp": "t",
        "status": "success",
        "stats": {
            "total_tokens": 1500,
            "input_tokens": 1200,
            "output_tokens": 300,
            "cached": 800,
            "input": 400,
            "duration_ms": 3100,
            "tool_calls": 2,
        },
    },
]


def test_it_maps_every_gemini_record_type_and_coalesces_deltas():
    fmt = GeminiStreamJson()
    events = feed_all(fmt, GEMINI_SESSION)
    assert kinds(events) == [
        "session",
        "user",
        "text",
        "tool-use",
        "tool-result",
        "tool-use",
        "tool-result",
        "error",
        "text",
        "usage",
        "result",
    ]
    assert events[2]["text"] == "I'll look."  # two deltas, one readable event
    assert events[3] == {
        "kind": "tool-use",
        "toolName": "list_directory",
        "toolCallId": "list_directory-1760-abc",
        "input": {"dir_path": "."},
    }
    assert events[4]["success"] is True and events[4]["toolOutput"] == "Listed 2 item(s)."
    assert events[6]["success"] is False and events[6]["error"] == "File not found: x"
    assert events[6]["toolName"] == "read_file"
    assert events[7]["error"] == "Loop detected, stopping" and events[7]["text"] == "warning"
    assert events[8]["text"] == "There are two files."
    assert events[9]["input"] == {
        "inputTokens": 1200,
        "outputTokens": 300,
        "cacheReadTokens": 800,
        "model": "gemini-2.5-pro",
    }
    assert fmt.outcome(0).output == "I'll look.There are two files."


def test_it_fails_a_gemini_run_with_its_error():
    fmt = GeminiStreamJson()
    feed_all(
        fmt,
        [
            {"type": "init", "session_id": "g", "model": "m"},
            {
                "type": "result",
                "status": "error",
                "error": {"type": "Error", "message": "quota exceeded"},
            },
        ],
    )
    assert fmt.outcome(1).error == "quota exceeded"


# --- lines --------------------------------------------------------------------------------


def test_it_keeps_todays_lines_behaviour():
    fmt = make_format("lines")
    assert isinstance(fmt, LinesFormat)
    events = feed_all(
        fmt,
        [
            "plain words",
            '{"kind": "tool-use", "toolName": "grep", "toolCallId": "c1", "input": {"q": 1}}',
            '{"kind": "steer", "text": "forged"}',
            '{"kind": "result", "text": "all done"}',
        ],
    )
    assert kinds(events) == ["text", "tool-use", "text", "result"]
    assert events[2]["text"] == '{"kind": "steer", "text": "forged"}'
    assert fmt.outcome(0).output == "all done"
    assert fmt.outcome(3, "boom").error == "exit status 3: boom"


# --- lines that are not records -----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_it_keeps_malformed_and_truncated_lines_as_text(name):
    fmt = make_format(name)
    lines = [
        "Warning: something on stdout",
        '{"type": "assistant", "message": {"content": [{"type": "te',  # cut mid-record
        "[1, 2, 3]",
        '{"type": "assistant"}',  # right type, missing its body
        '{"type": "item.completed"}',
        '{"type": "tool_use"}',
        '{"no_type": true}',
    ]
    events = feed_all(fmt, lines)
    texts = [e["text"] for e in events if e["kind"] == "text"]
    for line in lines:
        assert line in texts, f"{line!r} was lost by {name}"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_it_keeps_json_nested_past_the_parsers_depth_as_text(name):
    fmt = make_format(name)
    for line in ("[" * 200_000, '{"a":' * 100_000 + "1" + "}" * 100_000):
        (ev,) = fmt.feed(line)
        assert ev["kind"] == "text" and ev["text"].startswith(line[:100])


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_it_cuts_huge_lines_and_fields(name):
    fmt = make_format(name)
    big = "x" * (3 * 1024 * 1024)
    events = fmt.feed(big)
    assert len(events) == 1 and events[0]["kind"] == "text"
    assert len(events[0]["text"].encode()) < FIELD_BYTES + 200
    assert "cut by the runner" in events[0]["text"]
    # A huge but parseable record: each field is cut to what the server keeps.
    huge = {
        "lines": {
            "kind": "tool-result",
            "toolOutput": {"blob": "y" * 400_000},
            "text": "z" * 400_000,
        },
        "claude-stream-json": {
            "type": "user",
            "message": {
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "y" * 400_000}]
            },
        },
        "codex-json": {
            "type": "item.completed",
            "item": {
                "id": "i",
                "type": "command_execution",
                "command": "cat",
                "aggregated_output": "y" * 400_000,
                "exit_code": 0,
            },
        },
        "gemini-stream-json": {
            "type": "tool_result",
            "tool_id": "t",
            "status": "success",
            "output": "y" * 400_000,
        },
        "copilot-json": {
            "type": "tool.execution_complete",
            "data": {"toolCallId": "t", "success": True, "result": {"content": "y" * 400_000}},
        },
    }[name]
    events = fmt.feed(json.dumps(huge))
    for ev in events:
        _check_event(ev)
        for key, value in ev.items():
            size = len((value if isinstance(value, str) else json.dumps(value)).encode())
            assert size <= FIELD_BYTES + 100, (key, size)
    assert any("truncated by the runner" in str(ev.get("toolOutput", "")) for ev in events)


def test_it_drops_usage_figures_that_are_not_counts():
    fmt = ClaudeStreamJson()
    events = feed_all(
        fmt,
        [
            {
                "type": "result",
                "subtype": "success",
                "result": "ok",
                "total_cost_usd": float("nan"),
                "usage": {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": -1},
            }
        ],
    )
    usage = events[0]
    assert usage["kind"] == "usage"
    assert usage["input"] == {"inputTokens": 5, "outputTokens": 2}
    assert set(usage["input"]) <= USAGE_KEYS
    fmt = CodexJson()
    assert feed_all(fmt, [{"type": "turn.completed", "usage": {"input_tokens": "many"}}]) == []


def test_it_refuses_an_unknown_format_by_name():
    with pytest.raises(ValueError, match="format 'yaml' is not one of"):
        make_format("yaml")


async def test_it_reads_lines_from_a_real_process_without_holding_a_huge_line():
    script = (
        "import sys\n"
        "sys.stdout.write('first\\n')\n"
        "sys.stdout.write('h' * (5 * 1024 * 1024) + '\\n')\n"
        'sys.stdout.write(\'{"type": "turn.started"}\\n\')\n'
        "sys.stdout.write('no newline at the end')\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
    )
    got = [(line, size) async for line, size in read_lines(process.stdout, max_line=64 * 1024)]
    await process.wait()
    assert [size for _, size in got] == [5, 5 * 1024 * 1024, 24, 21]
    assert len(got[1][0]) == 64 * 1024
    fmt = CodexJson()
    events = []
    for line, size in got:
        events.extend(fmt.oversized(size, line) if size > len(line) else fmt.feed(line))
    assert kinds(events) == ["text", "text", "turn", "text"]
    assert f"line of {5 * 1024 * 1024} bytes cut" in events[1]["text"]
    assert events[3]["text"] == "no newline at the end"

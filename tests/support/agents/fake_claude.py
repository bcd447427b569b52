"""Prints a Claude Code ``stream-json`` session the way ``claude -p --output-format stream-json
--verbose`` does: ``ok`` ends in a success result, ``fail`` in ``error_max_turns`` (exit 1).

The message is echoed in the result, so a test can see which child ran.
"""

import json
import sys

mode, message = sys.argv[1], " ".join(sys.argv[2:])
sid = "5e3c0000-0000-4000-8000-000000000001"


def out(record):
    print(json.dumps(record), flush=True)


out({"type": "system", "subtype": "init", "session_id": sid, "model": "claude-test-1", "cwd": "."})
out(
    {
        "type": "assistant",
        "message": {
            "role": "assistant",
            "model": "claude-test-1",
            "content": [
                {"type": "thinking", "thinking": "Plan: echo it."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "echo"}},
            ],
        },
        "parent_tool_use_id": None,
        "session_id": sid,
    }
)
print("a stray line that is not JSON", flush=True)
out(
    {
        "type": "user",
        "message": {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "echoed"}],
        },
        "parent_tool_use_id": None,
        "session_id": sid,
    }
)
usage = {"input_tokens": 120, "output_tokens": 30, "cache_read_input_tokens": 10}
if mode == "ok":
    out(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": f"Done: {message}",
            "total_cost_usd": 0.002,
            "usage": usage,
            "session_id": sid,
        }
    )
    sys.exit(0)
out(
    {
        "type": "result",
        "subtype": "error_max_turns",
        "is_error": True,
        "total_cost_usd": 0.001,
        "usage": usage,
        "errors": ["Reached maximum number of turns (1)"],
        "session_id": sid,
    }
)
sys.exit(1)

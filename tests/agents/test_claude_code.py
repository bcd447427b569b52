"""The real Claude Code CLI, offline: a scripted model endpoint and a toy MCP server.

Groundwork for issue 10: the same harness will point the CLI at Canopy's ``/mcp``. These tests
need the CLI that ``make agents`` installs; without it they fail (``make test`` installs it).
"""

import json
import urllib.error
import urllib.request

import pytest

from delegation.runner.model_stub import Fail, ModelStub, Steps, ToolCall, fixed
from tests.support.agents.claude_cli import INSTALLED, claude_bin, run_claude
from tests.support.agents.toy_mcp import ToyMCP


def _post(url, body):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read().decode()


def _sse_events(text):
    events = []
    for chunk in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        events.append(data)
    return events


# --- the stub on its own ---------------------------------------------------------------------


def test_it_streams_a_scripted_tool_call_as_anthropic_sse():
    script = Steps("lookup", {"query": "a fairly long query string, split over deltas"})
    with ModelStub(script) as stub:
        status, headers, body = _post(
            stub.url + "/v1/messages",
            {
                "model": "claude-sonnet-4-5",
                "stream": True,
                "max_tokens": 100,
                "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
                "messages": [{"role": "user", "content": "find it"}],
            },
        )
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    events = _sse_events(body)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[0]["message"]["model"] == "claude-sonnet-4-5"
    assert events[0]["message"]["usage"]["input_tokens"] > 0
    start = next(e for e in events if e["type"] == "content_block_start")
    assert start["content_block"]["type"] == "tool_use"
    assert start["content_block"]["name"] == "lookup"
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert len(deltas) > 1 and {d["type"] for d in deltas} == {"input_json_delta"}
    assert json.loads("".join(d["partial_json"] for d in deltas)) == script.arguments
    assert "content_block_stop" in kinds
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"]["output_tokens"] > 0
    assert stub.turns[0].tool_names == ["lookup"]


def test_it_answers_the_non_streaming_form_and_records_tool_results():
    with ModelStub(Steps("lookup", {"q": 1}, answer="found it")) as stub:
        status, _, body = _post(
            stub.url + "/v1/messages",
            {
                "model": "m",
                "max_tokens": 10,
                "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
                "messages": [
                    {"role": "user", "content": "find"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}
                        ],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}],
                    },
                ],
            },
        )
    message = json.loads(body)
    assert status == 200
    assert message["content"] == [{"type": "text", "text": "found it"}]
    assert message["stop_reason"] == "end_turn" and message["usage"]["output_tokens"] > 0
    turn = stub.turns[0]
    assert [turn.tool_result_text(r) for r in turn.tool_results] == ["42"]


def test_it_counts_tokens_fails_on_script_and_logs_unknown_paths():
    with ModelStub(fixed(Fail(529, "overloaded_error", "busy"))) as stub:
        count = _post(stub.url + "/v1/messages/count_tokens", {"messages": []})
        failed = _post(stub.url + "/v1/messages", {"model": "m", "messages": []})
        missing = _post(stub.url + "/api/hello", {})
        with urllib.request.urlopen(
            urllib.request.Request(stub.url + "/api/hello", method="HEAD"), timeout=10
        ) as hello:
            assert hello.status == 200
    assert count[0] == 200 and json.loads(count[2])["input_tokens"] > 0
    assert failed[0] == 529
    assert json.loads(failed[2])["error"] == {"type": "overloaded_error", "message": "busy"}
    assert missing[0] == 404
    assert stub.unknown == ["POST /api/hello"]


def test_it_shows_a_broken_script_as_a_500_and_keeps_the_exception():
    def script(request):
        raise KeyError("nope")

    with ModelStub(script) as stub:
        status, _, body = _post(stub.url + "/v1/messages", {"model": "m", "messages": []})
    assert status == 500 and "KeyError" in body
    assert isinstance(stub.script_errors[0], KeyError)


# --- the CLI ---------------------------------------------------------------------------------


def test_it_finds_the_cli_in_the_project_or_through_claude_bin(monkeypatch, tmp_path):
    monkeypatch.delenv("CLAUDE_BIN", raising=False)
    assert claude_bin() == str(INSTALLED / "claude")
    monkeypatch.setenv("CLAUDE_BIN", str(tmp_path / "no-claude"))
    with pytest.raises(FileNotFoundError, match="make agents"):
        claude_bin()


def test_it_runs_claude_code_through_a_toy_mcp_tool_without_network(tmp_path):
    script = Steps(
        "mcp__toy__echo",
        {"text": "hello canopy"},
        preface="Calling echo.",
        answer=lambda r: "The tool said: " + r.tool_result_text(r.tool_results[-1]),
    )
    with ModelStub(script) as stub, ToyMCP() as toy:
        run = run_claude(
            "Say hello through the echo tool.",
            model_url=stub.url,
            home=tmp_path / "home",
            mcp_servers={"toy": {"type": "http", "url": toy.url}},
            allowed_tools=["mcp__toy__echo"],
        )

    assert run.returncode == 0, run.stderr[-2000:]
    # The scripted call reached the MCP server, with the scripted arguments.
    assert toy.calls == [("echo", {"text": "hello canopy"})]
    # The model was offered the MCP tool itself (not deferred behind a tool search) ...
    first, second = stub.turns[:2]
    assert "mcp__toy__echo" in first.tool_names and not first.tool_results
    # ... and got the tool's result in the next request, answering the call it made.
    (result,) = second.tool_results
    (call,) = second.tool_uses
    assert result["tool_use_id"] == call["id"] and not result.get("is_error")
    assert "echo: hello canopy" in second.tool_result_text(result)
    assert stub.unknown == [] and stub.script_errors == []

    (tool_use,) = run.content_blocks("assistant", "tool_use")
    assert (tool_use["name"], tool_use["input"]) == ("mcp__toy__echo", {"text": "hello canopy"})
    (tool_result,) = run.content_blocks("user", "tool_result")
    assert tool_result["tool_use_id"] == tool_use["id"]
    final = run.result
    assert (final["subtype"], final["is_error"]) == ("success", False)
    assert final["result"] == 'The tool said: {"result":"echo: hello canopy"}'
    assert final["num_turns"] == 2
    assert final["total_cost_usd"] > 0 and final["usage"]["input_tokens"] > 0


def test_it_hands_a_failing_mcp_tool_back_to_the_model_as_an_error(tmp_path):
    script = Steps("mcp__toy__fail", {"reason": "no such child"}, answer="noted")
    with ModelStub(script) as stub, ToyMCP() as toy:
        run = run_claude(
            "Call the fail tool.",
            model_url=stub.url,
            home=tmp_path / "home",
            mcp_servers={"toy": {"type": "http", "url": toy.url}},
            allowed_tools=["mcp__toy__fail"],
        )
    assert run.returncode == 0, run.stderr[-2000:]
    assert toy.calls == [("fail", {"reason": "no such child"})]
    (result,) = stub.turns[1].tool_results
    assert result["is_error"] is True
    assert "toy failure: no such child" in stub.turns[1].tool_result_text(result)
    (tool_result,) = run.content_blocks("user", "tool_result")
    assert tool_result["is_error"] is True
    assert run.result["is_error"] is False and run.result["result"] == "noted"


def test_it_ends_with_an_error_result_when_the_model_endpoint_refuses(tmp_path):
    with ModelStub(fixed(Fail(400, "invalid_request_error", "scripted bad request"))) as stub:
        run = run_claude("Hi.", model_url=stub.url, home=tmp_path / "home")
    assert run.returncode == 1
    assert stub.turns, "the CLI never reached the stub model"
    final = run.result
    assert final["is_error"] is True
    assert "scripted bad request" in final["result"]


def test_it_stops_at_max_turns_with_an_error_subtype(tmp_path):
    script = lambda r: ToolCall("mcp__toy__echo", {"text": "again"})  # noqa: E731
    with ModelStub(script) as stub, ToyMCP() as toy:
        run = run_claude(
            "Loop.",
            model_url=stub.url,
            home=tmp_path / "home",
            mcp_servers={"toy": {"type": "http", "url": toy.url}},
            allowed_tools=["mcp__toy__echo"],
            extra_args=["--max-turns", "1"],
        )
    assert run.returncode == 1
    assert (run.result["subtype"], run.result["is_error"]) == ("error_max_turns", True)
    assert len(stub.turns) == 1 and len(toy.calls) == 1


def test_it_retries_a_failing_model_endpoint_only_as_often_as_told(tmp_path):
    # The CLI retries a 5xx ten times with backoff (minutes); tests that script a failing model
    # bound that with CLAUDE_CODE_MAX_RETRIES.
    with ModelStub(fixed(Fail(500, "api_error", "scripted outage"))) as stub:
        run = run_claude(
            "Hi.", model_url=stub.url, home=tmp_path / "home", env={"CLAUDE_CODE_MAX_RETRIES": "1"}
        )
    assert run.returncode == 1
    assert len(stub.turns) == 2
    (retry,) = run.of_type("system", "api_retry")
    assert (retry["attempt"], retry["max_retries"], retry["error_status"]) == (1, 1, 500)
    assert run.result["is_error"] is True and "scripted outage" in run.result["result"]

"""Codex's usage priced by the model its command line names, and its stdin notice kept out of
the errors (``codex exec --json`` names no model in its records)."""

from __future__ import annotations

import json

from delegation.runner.formats import CodexJson, model_from_argv

TURN = {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 3}}


def test_it_reads_the_model_from_each_way_a_command_line_names_it():
    assert model_from_argv(["codex", "exec", "-c", 'model="gpt-5.1-codex"', "--", "hi"]) == (
        "gpt-5.1-codex"
    )
    assert model_from_argv(["codex", "exec", "-m", "gpt-5", "--", "hi"]) == "gpt-5"
    assert model_from_argv(["gemini", "--model=gemini-2.5-pro"]) == "gemini-2.5-pro"
    # The last one wins, as in the CLIs; none named is None, never "".
    assert model_from_argv(["x", "-m", "a", "-c", "model = 'b'"]) == "b"
    assert model_from_argv(["codex", "exec", "--json", "--", "-m"]) is None


def test_it_names_the_command_lines_model_on_codex_usage():
    fmt = CodexJson()
    fmt.model = "gpt-5.1-codex"
    (usage,) = fmt.feed(json.dumps(TURN))
    assert usage["kind"] == "usage" and usage["input"]["model"] == "gpt-5.1-codex", usage
    bare = CodexJson()
    (usage,) = bare.feed(json.dumps(TURN))
    assert "model" not in usage["input"]


def test_it_keeps_codexs_stdin_notice_out_of_the_errors():
    fmt = CodexJson()
    assert fmt.stderr_event("Reading additional input from stdin...") is None
    assert fmt.stderr_event("boom")["kind"] == "error"

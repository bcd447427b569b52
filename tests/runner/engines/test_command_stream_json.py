"""The command engine reading a real agent's own output format, end to end: a daphne server,
the reference runner host and a subprocess printing Claude Code ``stream-json``."""

from __future__ import annotations

import asyncio
import sys

import pytest
from asgiref.sync import sync_to_async

from delegation.runner.command import CommandEngine, CommandPreset
from delegation.runner.host import RunnerHost
from delegation.services import tokens
from tests.support.paths import AGENTS
from tests.support.runners import FAST

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_declared_level", "close_worker_connections"),
]

FAKE = [sys.executable, str(AGENTS / "fake_claude.py")]


def test_it_refuses_an_unknown_format_in_a_preset():
    with pytest.raises(ValueError, match="preset 'x': 'format' must be one of lines, claude"):
        CommandPreset.from_config({"name": "x", "command": ["true"], "format": "xml"})
    assert CommandPreset.from_config({"name": "x", "command": ["true"]}).format == "lines"


async def test_it_runs_a_claude_stream_json_child_to_events_usage_and_outcome(
    daphne_server, tmp_path
):
    _runner, token = await sync_to_async(tokens.create_runner)("fmt-runner")
    engine = CommandEngine(
        [
            CommandPreset.from_config(
                {
                    "name": "claude",
                    "command": FAKE + ["ok", "{message}"],
                    "format": "claude-stream-json",
                }
            ),
            CommandPreset.from_config(
                {"name": "capped", "command": FAKE + ["fail"], "format": "claude-stream-json"}
            ),
        ],
        str(tmp_path),
    )
    host = RunnerHost(daphne_server.ws_url, token, engine, extension_id="fmt", client_options=FAST)
    ext, gen, c = host.extension_id, host.generation, host.client

    async def run_child(profile, message, request_id):
        child = await c.child_start(
            "root-run",
            ext,
            gen,
            {"requestId": request_id, "profile": profile, "message": message},
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while True:
            result = await c.child_read("root-run", ext, gen, child.child_id)
            if result.done:
                return result
            assert loop.time() < deadline, result
            await asyncio.sleep(0.05)

    async with host:
        await c.open_run("root-conv", "root-run")
        ok = await run_child("claude", "hello", "r1")
        assert ok.status == "succeeded" and ok.output == "Done: hello"
        kinds = [e.kind for e in ok.events]
        assert kinds == [
            "session",
            "thinking",
            "tool-use",
            "text",
            "tool-result",
            "usage",
            "result",
        ]
        by_kind = {e.kind: e for e in ok.events}
        assert by_kind["text"].text == "a stray line that is not JSON"
        assert by_kind["tool-use"].tool_call_id == by_kind["tool-result"].tool_call_id == "toolu_1"
        assert by_kind["tool-result"].success is True
        assert by_kind["usage"].input == {
            "inputTokens": 120,
            "outputTokens": 30,
            "cacheReadTokens": 10,
            "costUsd": 0.002,
            "model": "claude-test-1",
            "costSource": "agent",  # added by the server when it stored the event
        }

        failed = await run_child("capped", "go", "r2")
        assert failed.status == "failed"
        # The agent's own reason, not just its exit status.
        assert failed.error == "Reached maximum number of turns (1)"
        await c.finish("root-run", output="ok")

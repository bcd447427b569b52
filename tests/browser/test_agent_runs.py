"""How the run page shows a real agent's run (SPEC §9, §10), in Debian's chromium: tool calls
with input and result side by side, thinking collapsed, and the run's usage summed."""

from __future__ import annotations

import pytest

from tests.support.browser import needs_chromium, sequences, sign_in
from tests.support.personas import PASSWORD

pytestmark = [
    pytest.mark.django_db(transaction=True),
    needs_chromium,
    pytest.mark.timeout(180),
    # A server of each test's own (the folder conftest's ``server``), with this heartbeat.
    pytest.mark.own_server,
]
DAPHNE_ENV = {"LIVE_HEARTBEAT_SECONDS": "1"}


def usage(inp, out, cost, **more):
    return {
        "kind": "usage",
        "text": "tokens",
        "input": {"inputTokens": inp, "outputTokens": out, "costUsd": cost, **more},
    }


def usage_card(page) -> dict:
    return {
        field: page.text_content(f'#usage [data-usage="{field}"]')
        for field in (
            "inputTokens",
            "outputTokens",
            "cacheReadTokens",
            "costUsd",
            "models",
            "events",
        )
    }


def test_it_pairs_tool_calls_folds_thinking_and_sums_usage(
    server,
    runner,
    browser,
    operator,
):
    runner.open("agent-run")
    page = browser()
    sign_in(page, server.http_url, operator.username, PASSWORD)
    page.goto(f"{server.http_url}/runs/agent-run/")
    page.wait_for_selector("#live-state[data-state=live]")
    assert page.is_hidden("#usage")  # no usage yet: no card of zeros
    runner.emit(
        "agent-run",
        {"kind": "thinking", "text": "First I look for the parser.\nThen I read it closely."},
        {
            "kind": "tool-use",
            "toolName": "Grep",
            "toolCallId": "toolu_1",
            "input": {"pattern": "def parse"},
        },
        {
            "kind": "tool-use",
            "toolName": "Bash",
            "toolCallId": "toolu_2",
            "input": {"command": "make test"},
        },
        usage(1200, 40, 0.0021, model="claude-test-1", cacheReadTokens=300),
    )
    page.wait_for_selector('#events [data-sequence="4"]')
    # Thinking is folded to its first line; the whole text is one click away.
    thinking = page.locator('#events [data-sequence="1"] details.ev-thinking-box')
    assert thinking.get_attribute("open") is None
    assert page.text_content('#events [data-sequence="1"] summary') == (
        "First I look for the parser."
    )
    assert not page.is_visible('#events [data-sequence="1"] details .ev-text')
    page.click('#events [data-sequence="1"] summary')
    assert "read it closely" in page.text_content('#events [data-sequence="1"] details .ev-text')
    # A call waits for its result beside its input.
    use = '#events [data-sequence="2"]'
    assert "def parse" in page.text_content(f"{use} [data-role=tool-input]")
    assert page.get_attribute(f"{use} [data-role=tool-output]", "data-state") == "pending"
    assert usage_card(page) == {
        "inputTokens": "1,200",
        "outputTokens": "40",
        "cacheReadTokens": "300",
        "costUsd": "$0.0021",
        "models": "claude-test-1",
        "events": "1",
    }

    # Results arrive out of call order; each goes beside its own call, by toolCallId.
    runner.emit(
        "agent-run",
        {
            "kind": "tool-result",
            "toolName": "Bash",
            "toolCallId": "toolu_2",
            "success": False,
            "toolOutput": "exit 2: 3 tests failed",
        },
        {
            "kind": "tool-result",
            "toolName": "Grep",
            "toolCallId": "toolu_1",
            "success": True,
            "toolOutput": "parser.py:12: def parse(line):",
        },
        usage(800, 60, 0.0019, model="claude-test-1"),
        {"kind": "result", "text": "Fixed the parser."},
    )
    page.wait_for_selector('#events [data-sequence="8"]')
    assert sequences(page) == list(range(1, 9))  # every event still listed, once, in order
    grep_out = f"{use} [data-role=tool-output]"
    assert page.get_attribute(grep_out, "data-state") == "done"
    assert "parser.py:12: def parse(line):" in page.text_content(grep_out)
    assert page.text_content(f"{grep_out} .outcome") == "success"
    bash_out = '#events [data-sequence="3"] [data-role=tool-output]'
    assert "exit 2: 3 tests failed" in page.text_content(bash_out)
    assert page.text_content(f"{bash_out} .outcome") == "failure"
    # The result rows fold into a pointer back to their call.
    assert "ev-paired" in page.get_attribute('#events [data-sequence="6"]', "class")
    assert page.text_content('#events [data-sequence="6"] a') == "#2"
    summed = {
        "inputTokens": "2,000",
        "outputTokens": "100",
        "cacheReadTokens": "300",
        "costUsd": "$0.0040",
        "models": "claude-test-1",
        "events": "2",
    }
    assert usage_card(page) == summed

    # A fresh page replays the stream from the database to the same picture, counted once.
    page.reload()
    page.wait_for_selector('#events [data-sequence="8"]')
    assert usage_card(page) == summed
    assert page.get_attribute(grep_out, "data-state") == "done"

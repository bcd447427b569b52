"""bench.agents' scripted model and its send stamps, through the real HTTP model stub: the
latency figures are only as good as the marker each turn carries and the time it left."""

from __future__ import annotations

import json
import time
import urllib.request

from bench.agents import CALLS, Calls, stamp
from delegation.runner.model_stub import ModelStub

TOOLS = [{"name": "mcp__canopy__list_profiles"}, {"name": "mcp__canopy__read_child"}]


def post(url: str, messages: list) -> bytes:
    body = {"model": "claude-sonnet-4-5", "stream": True, "tools": TOOLS, "messages": messages}
    request = urllib.request.Request(
        f"{url}/v1/messages",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.read()


def tool_input(stream: bytes) -> dict:
    """The tool call's input, reassembled from the stream's ``input_json_delta`` pieces."""
    pieces = []
    for line in stream.decode().splitlines():
        if line.startswith("data: "):
            delta = json.loads(line[6:]).get("delta") or {}
            pieces.append(delta.get("partial_json", ""))
    return json.loads("".join(pieces))


def used(n: int) -> list:
    names = ["mcp__canopy__list_profiles", "mcp__canopy__read_child"]
    return [
        {"role": "user", "content": "Run the steps."},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": f"t{i}", "name": names[i % 2], "input": {}}
                for i in range(n)
            ],
        },
    ]


def test_it_stamps_each_turns_marker_when_the_stub_sends_it_and_alternates_the_tools():
    with ModelStub(Calls()) as stub:
        sent = stamp(stub._server)
        before = time.monotonic_ns()
        first = post(stub.url, used(0))
        second = post(stub.url, used(1))
        last = post(stub.url, used(CALLS))
    assert b"step mk000" in first and b"mcp__canopy__list_profiles" in first
    assert b"step mk001" in second and b"mcp__canopy__read_child" in second
    assert tool_input(first) == {}
    assert tool_input(second) == {"childId": "no-such-child-1"}  # never two identical calls
    assert b"all steps done" in last and b"tool_use" not in last
    assert sorted(sent) == [0, 1] and before < sent[0] < sent[1] <= time.monotonic_ns()

"""The how-to "Fan out and join" quotes exactly what the model reads: the server's
instructions and the description of each join tool and of each of its arguments."""

from __future__ import annotations

from delegation.mcp.join import JOIN_INSTRUCTIONS
from delegation.mcp.tools import build_server
from tests.support.paths import PROJECT

HOW_TO = PROJECT / "docs" / "how-to" / "fan-out-and-join.md"
MARKER = "<!-- join-tool-descriptions -->"


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_it_quotes_the_join_tools_descriptions_the_model_reads():
    text = HOW_TO.read_text(encoding="utf-8")
    quoted = _flat(text.split(MARKER, 1)[1])
    assert _flat(JOIN_INSTRUCTIONS) in _flat(text)
    tools = {tool.name: tool for tool in build_server()._tool_manager.list_tools()}
    for name in ("await_children", "conclude"):
        tool = tools[name]
        assert f"**`{name}`**: {_flat(tool.description)}" in quoted, name
        for argument, schema in tool.parameters["properties"].items():
            assert f"| `{argument}` | {_flat(schema['description'])} |" in quoted, argument

"""Output formats of the ``command`` engine: an agent's own stdout records → Canopy events.

A preset names its ``format`` (SPEC §9):

- ``lines``: today's behaviour (a JSON object with a string ``kind`` is an event, anything
  else a ``text`` event);
- ``claude-stream-json``: ``claude -p --output-format stream-json --verbose``;
- ``codex-json``: ``codex exec --json``;
- ``gemini-stream-json``: ``gemini --output-format stream-json``;
- ``copilot-json``: ``copilot -p ... --output-format json`` (GitHub Copilot CLI).

Every parser has the same surface: :meth:`Format.feed` takes one stdout line and returns the
events it maps to, :meth:`Format.flush` returns what it was still coalescing, and
:meth:`Format.outcome` turns what the agent said (its final result record, or the lack of
one) and the exit status into the run's :class:`Outcome`.

Rules shared by all formats:

- a line that is not a JSON object, or a record whose shape the parser does not understand,
  becomes a ``text`` event holding the line: nothing the agent printed is lost;
- every string field is cut to 32 KiB and every structured field whose JSON is over 32 KiB
  is replaced by its cut JSON text (the server keeps no more than that anyway), so a huge
  line never becomes an event the SDK refuses;
- usage events carry in ``input`` exactly the SPEC §10 keys, from the agent's own figures;
- tool calls keep the agent's own ids in ``toolCallId``.

Claude Code's in-process subagents (records with ``parent_tool_use_id``) stay attached to the
tool call that started them: their text and thinking carry that call's id as ``toolCallId``,
and their own tool calls carry ``"<parent id>/<own id>"``, so a reader can nest them under the
parent call by prefix and still pair each nested use with its result.
"""

from __future__ import annotations

from delegation.runner.formats.base import (
    COALESCE_BYTES,
    FIELD_BYTES,
    MAX_PARSE_BYTES,
    TRUNCATED,
    USAGE_INT_KEYS,
    Format,
    clip,
    cut,
    model_from_argv,
    read_lines,
    usage_event,
)
from delegation.runner.formats.claude import CLAUDE_FAILURES, ClaudeStreamJson
from delegation.runner.formats.codex import CODEX_TOOL_ITEMS, CodexJson
from delegation.runner.formats.copilot import CopilotJson
from delegation.runner.formats.gemini import GeminiStreamJson
from delegation.runner.formats.lines import LinesFormat

__all__ = [
    "CLAUDE_FAILURES",
    "COALESCE_BYTES",
    "CODEX_TOOL_ITEMS",
    "FIELD_BYTES",
    "FORMATS",
    "MAX_PARSE_BYTES",
    "TRUNCATED",
    "USAGE_INT_KEYS",
    "ClaudeStreamJson",
    "CodexJson",
    "CopilotJson",
    "Format",
    "GeminiStreamJson",
    "LinesFormat",
    "clip",
    "cut",
    "make_format",
    "model_from_argv",
    "read_lines",
    "usage_event",
]


FORMATS: dict[str, type[Format]] = {
    cls.name: cls
    for cls in (LinesFormat, ClaudeStreamJson, CodexJson, GeminiStreamJson, CopilotJson)
}


def make_format(name: str) -> Format:
    try:
        return FORMATS[name]()
    except KeyError:
        raise ValueError(f"format {name!r} is not one of {', '.join(sorted(FORMATS))}") from None

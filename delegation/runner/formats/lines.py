"""The ``lines`` format: today's behaviour (JSON objects with a ``kind`` are events)."""

from __future__ import annotations

from delegation.client import event
from delegation.runner.formats.base import FIELD_BYTES, MAX_PARSE_BYTES, Format, clip


class LinesFormat(Format):
    """Today's behaviour: ``{"kind": ...}`` objects are events, other lines text."""

    name = "lines"

    def feed(self, line: str | bytes) -> list[dict]:
        from delegation.runner.command import fit, line_event

        if isinstance(line, bytes | bytearray):
            if len(line) > MAX_PARSE_BYTES:
                return [self._oversized(len(line), bytes(line[:FIELD_BYTES]))]
            line = bytes(line).decode("utf-8", errors="replace")
        line = line.rstrip("\r\n")
        if not line.strip():
            return []
        if len(line) > MAX_PARSE_BYTES:
            return [self._oversized(len(line.encode("utf-8")), line[:FIELD_BYTES].encode())]
        try:
            ev = fit(line_event(line))
        except RecursionError:  # JSON nested past the parser's depth: keep it as text
            ev = clip(event("text", line))
        if ev["kind"] == "result" and "text" in ev:
            self.result_text = ev["text"]
        elif ev["kind"] == "text" and "text" in ev:
            self.note_text(ev["text"])
        return [ev]

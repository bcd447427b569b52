"""The ``lines`` format: today's behaviour (JSON objects with a ``kind`` are events)."""

from __future__ import annotations

import json
from typing import Any

from delegation.client import event
from delegation.protocol import SERVER_EVENT_KINDS
from delegation.runner.formats.base import FIELD_BYTES, MAX_PARSE_BYTES, TRUNCATED, Format, clip

# An event over this many bytes of JSON has its long fields cut (see fit).
FIT_BYTES = 256 * 1024
STRING_FIELDS = ("text", "toolName", "toolCallId", "error")


def line_event(line: str) -> dict:
    """One stdout line as an event: a JSON object with a string ``kind``, else ``text``."""
    stripped = line.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("kind"), str):
            built = _structured(data)
            if built is not None:
                return built
    return event("text", line)


def _structured(data: dict) -> dict | None:
    kind = data["kind"].strip()
    if not kind or kind in SERVER_EVENT_KINDS or len(kind.encode()) > 64:
        return None  # the server's own kinds cannot be forged from an agent's stdout
    out: dict[str, Any] = {"kind": kind}
    for name in STRING_FIELDS:
        value = data.get(name)
        if value is not None:
            if not isinstance(value, str):
                return None
            out[name] = value
    if "success" in data and data["success"] is not None:
        if not isinstance(data["success"], bool):
            return None
        out["success"] = data["success"]
    for name in ("input", "toolOutput"):
        if data.get(name) is not None:
            out[name] = data[name]
    return out


def fit(ev: dict) -> dict:
    """Cut an oversized event to what the server keeps anyway (32 KiB per field)."""
    if len(json.dumps(ev, ensure_ascii=False).encode("utf-8")) <= FIT_BYTES:
        return ev
    out = dict(ev)
    for name, value in ev.items():
        if name == "kind":
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if len(text.encode("utf-8")) > FIELD_BYTES:
            cut = text.encode("utf-8")[:FIELD_BYTES].decode("utf-8", errors="ignore")
            out[name] = cut + TRUNCATED
    return out


class LinesFormat(Format):
    """Today's behaviour: ``{"kind": ...}`` objects are events, other lines text."""

    name = "lines"

    def feed(self, line: str | bytes) -> list[dict]:
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

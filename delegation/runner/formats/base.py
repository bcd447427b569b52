"""What every output format shares: the size limits, ``cut``/``clip``, the usage event,
the :class:`Format` base class and the bounded line reader (rules in the package docstring)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from delegation.client import event
from delegation.runner.host import Outcome

FIELD_BYTES = 32 * 1024
# A line over this many bytes is not parsed at all: its head becomes a text event.
MAX_PARSE_BYTES = 1024 * 1024
TRUNCATED = " [truncated by the runner]"
# Coalesced streaming text is flushed as one event once it grows past this.
COALESCE_BYTES = 8 * 1024
USAGE_INT_KEYS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens")


# --- helpers ------------------------------------------------------------------------------


def cut(text: str, limit: int = FIELD_BYTES) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes (at a character boundary), marked when cut."""
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", errors="ignore") + TRUNCATED


def clip(ev: dict) -> dict:
    """Every field of ``ev`` within what the server stores (32 KiB each)."""
    out = {}
    for name, value in ev.items():
        if value is None:
            continue
        if name in ("kind", "success"):
            out[name] = value
        elif isinstance(value, str):
            out[name] = cut(value)
        else:
            text = json.dumps(value, ensure_ascii=False, default=str)
            out[name] = value if len(text.encode("utf-8")) <= FIELD_BYTES else cut(text)
    return out


def usage_event(
    input_tokens: Any,
    output_tokens: Any,
    *,
    cache_read: Any = None,
    cache_write: Any = None,
    cost_usd: Any = None,
    model: Any = None,
) -> dict | None:
    """A SPEC §10 ``usage`` event, or None when the agent's figures are not usable numbers."""
    figures = {"inputTokens": input_tokens, "outputTokens": output_tokens}
    if cache_read is not None:
        figures["cacheReadTokens"] = cache_read
    if cache_write is not None:
        figures["cacheWriteTokens"] = cache_write
    usage: dict[str, Any] = {}
    for key, value in figures.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            if key in ("inputTokens", "outputTokens"):
                return None
            continue
        if not math.isfinite(value) or value < 0 or int(value) != value:
            if key in ("inputTokens", "outputTokens"):
                return None
            continue
        usage[key] = int(value)
    if (
        isinstance(cost_usd, int | float)
        and not isinstance(cost_usd, bool)
        and math.isfinite(cost_usd)
        and cost_usd >= 0
    ):
        usage["costUsd"] = float(cost_usd)
    if isinstance(model, str) and model:
        usage["model"] = model
    parts = [f"{usage['inputTokens']} in", f"{usage['outputTokens']} out"]
    if "costUsd" in usage:
        parts.append(f"${usage['costUsd']:.4f}")
    return event("usage", "tokens " + ", ".join(parts), input=usage)


def _text_of(content: Any) -> str:
    """Readable text of a tool result's ``content`` (a string or a list of blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, Mapping) and block.get("type") == "image":
                parts.append("[image]")
            elif isinstance(block, str):
                parts.append(block)
            else:
                parts.append(json.dumps(block, ensure_ascii=False, default=str))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, default=str)


class Format:
    """One agent's output format. Subclasses handle parsed records in :meth:`record`."""

    name = ""
    # Stderr lines (by prefix) the agent prints to inform, not to fail: stored as ``log``.
    informational_stderr: tuple[str, ...] = ()

    def __init__(self) -> None:
        # The model the run's command line names (``-m``/``--model``/``-c model=``), for an
        # agent whose records name none: the price table can still price its usage.
        self.model: str | None = None
        self.result_text: str | None = None  # the agent's own final answer, when it gives one
        self.failure: str | None = None  # the agent's own reason for failing
        self.last_text: str | None = None
        self.last_error: str | None = None
        self.turns_ended = 0  # the agent's end-of-turn records seen (Claude Code's ``result``)

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
        stripped = line.strip()
        data = None
        if stripped.startswith("{"):
            try:
                data = json.loads(stripped)
            except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
                data = None
        events: list[dict] | None = None
        if isinstance(data, dict):
            try:
                events = self.record(data)
            except (KeyError, TypeError, ValueError, AttributeError):
                events = None  # a record of a shape this parser does not know: keep it as text
        if events is None:
            events = [*self.flush(), event("text", line)]
        return [clip(ev) for ev in events]

    def oversized(self, size: int, head: bytes) -> list[dict]:
        """A line too long to keep (``size`` bytes, of which ``head`` was kept)."""
        return [clip(self._oversized(size, head))]

    def _oversized(self, size: int, head: bytes) -> dict:
        text = head.decode("utf-8", errors="ignore")
        return event(
            "text", cut(text, FIELD_BYTES - 256) + f" [line of {size} bytes cut by the runner]"
        )

    def record(self, data: dict) -> list[dict] | None:
        """Events for one parsed JSON object; None keeps the line as a text event."""
        raise NotImplementedError

    def flush(self) -> list[dict]:
        return []

    def usage_file(self, text: str) -> list[dict]:
        """Events from the file the agent wrote at ``{usageFile}`` (read once it exited)."""
        return []

    def stderr_event(self, line: str) -> dict | None:
        """The event for one stderr line; None for an informational one (see ``log``)."""
        if line.startswith(self.informational_stderr) and self.informational_stderr:
            return None
        return event("error", error=line)

    def note_text(self, text: str) -> None:
        if text.strip():
            self.last_text = text

    def outcome(self, returncode: int, stderr_tail: str | None = None) -> Outcome:
        """The run's outcome once the agent exited with ``returncode``."""
        if self.failure is not None:
            return Outcome(error=self.failure)
        if returncode == 0:
            output = self.result_text if self.result_text is not None else self.last_text
            return Outcome(output=output or "")
        reason = (
            f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
        )
        detail = stderr_tail or self.last_error
        if detail:
            reason += f": {detail[:500]}"
        return Outcome(error=reason)


def model_from_argv(argv: list[str]) -> str | None:
    """The model a command line names: ``-m X``, ``--model X``, ``--model=X`` or a Codex
    ``-c model="X"`` override; the last one wins, as in the CLIs."""
    found = None
    for i, arg in enumerate(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if arg in ("-m", "--model") and nxt:
            found = nxt
        elif arg.startswith("--model="):
            found = arg.split("=", 1)[1]
        elif arg in ("-c", "--config") and nxt.replace(" ", "").startswith("model="):
            found = nxt.split("=", 1)[1].strip().strip("\"'")
    return found or None


async def read_lines(reader, max_line: int = MAX_PARSE_BYTES, chunk: int = 64 * 1024):
    """Yield ``(line, size)`` from an asyncio stream, never holding more than ``max_line``
    bytes of one line: a longer line yields its head and its full size, the rest is skipped.
    """
    buffer = bytearray()
    size = 0  # bytes of the current line seen so far (kept or not)
    while True:
        data = await reader.read(chunk)
        if not data:
            if size:
                yield bytes(buffer), size
            return
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            piece = data[start:end]
            room = max_line - len(buffer)
            if room > 0:
                buffer += piece[:room]
            size += len(piece)
            if newline < 0:
                break
            yield bytes(buffer), size
            buffer.clear()
            size = 0
            start = newline + 1

"""Delegation depth: the level an agent runs at, and how it travels (SPEC §3).

Mirrors Pando's ``depth`` package in Python naming. Deliberately stdlib-only so the runner, the
SDK and the server can all share one definition of "a valid level".

Readers never raise: a malformed declaration means "not declared". Writers (``meta``,
``child_env``, ``with_context``, ``set_session``, ...) do raise on a bad level, because emitting
a carrier every reader ignores would silently reset a child to level 0 and escape the cap.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

ENV_VAR = "PANDO_DELEGATION_DEPTH"
META_KEY = "pando:delegationDepth"
HEADER = "X-Pando-Delegation-Depth"
MAX_LEVEL = 2**63 - 1  # int64, so levels round-trip through Go and JSON peers unchanged

# Spelled out rather than \s / \d / int(): those accept Unicode spaces and digits, and int()
# also accepts "1_0"; the contract is ASCII only. fullmatch, because "$" would allow a "\n".
_LEVEL_RE = re.compile(r"[ \t\n\r\v\f]*\+?([0-9]+)[ \t\n\r\v\f]*")
_MAX_DIGITS = len(str(MAX_LEVEL))


def parse(value: str) -> int | None:
    """Parse a declared level from text (env var, header); ``None`` if invalid."""
    if not isinstance(value, str):
        return None
    match = _LEVEL_RE.fullmatch(value)
    if match is None:
        return None
    # Bound the length before int(): huge inputs would hit int's digit limit and raise.
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) > _MAX_DIGITS:
        return None
    level = int(digits)
    return level if level <= MAX_LEVEL else None


def parse_json_value(value: object) -> int | None:
    """Parse a declared level from a decoded JSON value; ``None`` if invalid."""
    # bool is an int subclass, but JSON true is not a level.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_LEVEL else None
    if isinstance(value, float):
        # JSON has one number type, so 2.0 from a JS peer is a legitimate 2.
        if not (math.isfinite(value) and value.is_integer()):
            return None
        level = int(value)
        return level if 0 <= level <= MAX_LEVEL else None
    if isinstance(value, str):
        return parse(value)
    return None


def from_meta(meta: object) -> int | None:
    """Read the level from a ``_meta`` object; ``None`` if absent or invalid."""
    if not isinstance(meta, Mapping):
        return None
    return parse_json_value(meta.get(META_KEY))


def meta(level: int, base: Mapping | None = None) -> dict:
    """Return a copy of ``base`` carrying ``level`` under ``META_KEY``."""
    out = dict(base or {})
    out[META_KEY] = _require(level)
    return out


def from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """Read the level from ``environ`` (default ``os.environ``); ``None`` if unset or invalid."""
    value = (os.environ if environ is None else environ).get(ENV_VAR)
    return None if value is None else parse(value)


def env_entry(level: int) -> str:
    """``NAME=value`` form, for launchers that build an env list rather than a mapping."""
    return f"{ENV_VAR}={_require(level)}"


def child_env(level: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a subprocess agent running at ``level``.

    Always set explicitly: an inherited value would be the parent's level, not the child's.
    """
    env = dict(os.environ if base is None else base)
    env[ENV_VAR] = str(_require(level))
    return env


# A ContextVar rather than a thread-local so the level follows asyncio tasks, not threads.
_context_level: ContextVar[int | None] = ContextVar("pando_delegation_depth", default=None)


@contextmanager
def with_context(level: int) -> Iterator[int]:
    """Run the block at ``level``; the previous value is restored on exit, even on error."""
    token = _context_level.set(_require(level))
    try:
        yield level
    finally:
        _context_level.reset(token)


def from_context() -> int | None:
    return _context_level.get()


# Warm agent processes host many sessions at different levels, so the level is keyed by
# session rather than held per process. Plain dict + lock: a host's threads share it.
_sessions: dict[str, int] = {}
_sessions_lock = threading.Lock()


def set_session(session_id: str, level: int) -> None:
    level = _require(level)
    with _sessions_lock:
        _sessions[session_id] = level


def session(session_id: str) -> int | None:
    with _sessions_lock:
        return _sessions.get(session_id)


def clear_session(session_id: str) -> None:
    with _sessions_lock:
        _sessions.pop(session_id, None)


def resolve(
    explicit: object = None,
    session_id: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """The level to act at: the first valid carrier wins, else 0.

    SPEC order is explicit -> session -> env -> 0. The context value sits right after the
    explicit one: it is how a request-scoped explicit value travels through Python call
    stacks, so it must outrank longer-lived sources.
    """
    # Evaluated eagerly: every source is a cheap lookup without side effects.
    levels = (
        parse_json_value(explicit),
        from_context(),
        None if session_id is None else session(session_id),
        from_env(environ),
    )
    return next((level for level in levels if level is not None), 0)


def child_level(parent_level: int) -> int:
    return _require(_require(parent_level) + 1)


def may_spawn(level: int, max_depth: int) -> bool:
    """Level N may spawn iff N + 1 <= max_depth; so max_depth 0 disables delegation."""
    return level + 1 <= max_depth


def refusal_message(level: int, max_depth: int) -> str:
    # Worded for the calling model: a soft error it can act on, not a crash.
    return (
        f"delegation depth limit reached: level {level} may not spawn (max {max_depth}); "
        "finish the work yourself"
    )


def _require(level: int) -> int:
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"delegation level must be an int, not {type(level).__name__}")
    if not 0 <= level <= MAX_LEVEL:
        raise ValueError(f"delegation level out of range [0, {MAX_LEVEL}]: {level}")
    return level

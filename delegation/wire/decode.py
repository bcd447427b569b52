"""The strict decoder (SPEC §4): one JSON object, no trailing data, no duplicate keys, no
NaN, bounded nesting, no unpaired surrogate, no NUL where the record cannot store one; and
validation failures of the schemas turned into a −32602 that names each field and its rule.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from delegation.errors import INVALID_PARAMS, PARSE_ERROR, RpcError

# Deeper nesting than any frame needs; past it the decoder (and every recursive walk after it)
# would run into Python's recursion limit.
MAX_NESTING = 64


# --- Strict JSON --------------------------------------------------------------------------


class _DuplicateKey(ValueError):
    pass


def _refuse_duplicates(pairs):
    # dict() in C, and a key-by-key walk only when it came out short: a frame of a hundred
    # events decodes in half the time of a walk over every pair (issue 39).
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _value in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def loads_strict(text: str | bytes) -> Any:
    """Decode one JSON value, refusing duplicate keys, NaN/Infinity and trailing data."""
    if isinstance(text, bytes | bytearray):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise RpcError(PARSE_ERROR, "parse error: frame is not valid UTF-8") from None
    too_deep = RpcError(
        PARSE_ERROR, f"parse error: nested deeper than {MAX_NESTING} arrays or objects"
    )
    try:
        # json.loads already refuses anything but whitespace after the value ("Extra data").
        value = json.loads(
            text, object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant
        )
    except _DuplicateKey as exc:
        raise RpcError(PARSE_ERROR, f"parse error: duplicate key {exc.args[0]!r}") from None
    except ValueError as exc:
        raise RpcError(PARSE_ERROR, f"parse error: {exc}") from None
    except RecursionError:
        raise too_deep from None
    # Two C-level counts keep the walk off the common, shallow frame.
    if text.count("[") + text.count("{") > MAX_NESTING and _nesting(value) > MAX_NESTING:
        raise too_deep
    # A "\\ud800" escape is valid JSON syntax but no text: refuse it here, once, instead of
    # failing later wherever the string is first encoded.
    if "\\ud" in text or "\\uD" in text:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise RpcError(
                PARSE_ERROR, "parse error: a string holds an unpaired UTF-16 surrogate"
            ) from None
    return value


def _nesting(value: Any) -> int:
    """How deeply arrays and objects nest in ``value``, walked a level at a time (no
    recursion, and one comprehension per level rather than a step per value)."""
    deepest = 0
    level = [value] if isinstance(value, dict | list) else []
    while level and deepest <= MAX_NESTING:
        deepest += 1
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
    return deepest


def refuse_nul(value: Any, prefix: str = "params") -> None:
    """PostgreSQL can store no NUL in text or jsonb: refuse it up front, naming the field."""
    where = _nul_path(value, prefix)
    if where is not None:
        raise RpcError(
            INVALID_PARAMS,
            f"{where}: NUL characters (\\u0000) are refused; the record cannot store them",
        )


def _nul_path(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string (or key) holding a NUL, or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else key
            if "\x00" in key:
                return here
            found = _nul_path(item, here)
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _nul_path(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def canonical(value: Any) -> str:
    """A stable rendering used to compare inputs (idempotency, replayed events)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def truncate_utf8(text: str, limit: int) -> tuple[str, bool]:
    """Cut text to at most ``limit`` UTF-8 bytes without splitting a character."""
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text, False
    return encoded[:limit].decode("utf-8", errors="ignore"), True


# --- Errors -------------------------------------------------------------------------------


def _loc(loc: tuple, prefix: str = "") -> str:
    parts = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    text = "".join(parts)
    if prefix:
        return f"{prefix}.{text}" if text else prefix
    return text or "params"


def describe(error: ValidationError, prefix: str = "") -> str:
    """One readable line per problem, each naming the field and the rule it broke."""
    lines = []
    for item in error.errors(include_url=False):
        loc = item["loc"]
        # Drop pydantic's internal markers such as 'function-after[...]' from the path.
        loc = tuple(p for p in loc if not (isinstance(p, str) and "[" in p and "(" not in p))
        where = _loc(loc, prefix)
        kind = item["type"]
        if kind == "extra_forbidden":
            rule = "unknown field"
        elif kind == "missing":
            rule = "required field missing"
        elif item.get("input", 0) is None:
            rule = "null is not allowed (omit the field to inherit)"
        elif kind == "value_error":
            rule = str(item["ctx"]["error"]) if item.get("ctx") else item["msg"]
        else:
            rule = item["msg"]
        lines.append(f"{where}: {rule}")
    return "; ".join(lines)


def parse_model(model: type[BaseModel], data: Any, prefix: str = "params"):
    """Validate ``data`` strictly, turning failures into a −32602 naming each field."""
    if not isinstance(data, dict):
        raise RpcError(INVALID_PARAMS, f"{prefix}: must be a JSON object")
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        raise RpcError(INVALID_PARAMS, describe(exc, prefix)) from None

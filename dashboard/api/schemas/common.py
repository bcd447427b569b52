"""Shapes every resource uses: exact query-parameter types, cursors, and the body patterns
(checked server-side with Python's ``re`` exactly as published)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from ninja import Schema
from pydantic import BeforeValidator, Field, WithJsonSchema

BIGINT_MAX = 2**63 - 1


_DIGITS = re.compile(r"-?[0-9]+")


_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"
)


def _query_int(value: Any) -> Any:
    if isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            raise ValueError("must be a decimal integer")
        return int(value)
    return value


def _query_bool(value: Any) -> Any:
    if isinstance(value, str):
        if value not in ("true", "false"):
            raise ValueError("must be true or false")
        return value == "true"
    return value


def _query_time(value: Any) -> Any:
    """RFC 3339 with an offset, as JSON Schema's date-time; read and clamped in UTC."""
    if not isinstance(value, str):
        return value
    match = _RFC3339.fullmatch(value)
    if not match:
        raise ValueError("must be an RFC 3339 date-time with an offset, e.g. 2025-01-31T12:00:00Z")
    day, hour, minute, second, fraction, offset = match.groups()
    if second == "60":  # a leap second: the instant just before the next minute
        second, fraction = "59", ".999999"
    fraction = (fraction or "")[:7]
    offset = "+00:00" if offset in ("Z", "z") else offset
    try:
        parsed = datetime.fromisoformat(f"{day}T{hour}:{minute}:{second}{fraction}{offset}")
    except ValueError as exc:
        raise ValueError(f"not a valid date-time: {exc}") from None
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        # Past the ends of what a datetime can hold in UTC: the filter then holds everywhere.
        return (
            datetime.max.replace(tzinfo=UTC)
            if parsed.year > 1
            else datetime.min.replace(tzinfo=UTC)
        )


QueryBool = Annotated[bool, BeforeValidator(_query_bool)]


QueryTime = Annotated[
    datetime,
    BeforeValidator(_query_time),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


# Constraints go before the parsing validator so they land on the integer schema itself
# (JSON Schema minimum/maximum) rather than on the wrapper.
DepthParam = Annotated[int, Field(ge=0, le=BIGINT_MAX), BeforeValidator(_query_int)]


SequenceParam = DepthParam


IdParam = Annotated[int, Field(ge=1, le=BIGINT_MAX), BeforeValidator(_query_int)]


LimitParam = Annotated[
    int,
    Field(ge=1, le=1000, description="Page size, 1 to 1000 (default 100)."),
    BeforeValidator(_query_int),
]


def cursor_param(prefix: str):
    return Annotated[
        str,
        Field(
            pattern=rf"^{prefix}[0-9a-f]{{1,16}}$",
            description="Opaque position from a previous page's `next`; pass it back unchanged.",
        ),
    ]


# JSON Schema patterns, checked server-side with Python's `re` exactly as published.
NO_NUL = r"^[^\x00]*$"


def no_nul(value: str) -> str:
    """A field validator: the published NO_NUL pattern, checked as published."""
    if not re.search(NO_NUL, value):
        raise ValueError("must not contain NUL")
    return value


NOT_BLANK_NO_NUL = r"^[^\x00]*[^\x00\s][^\x00]*$"


# A REST requestId: a SPEC ValidID restricted to printable ASCII, so that 128 characters are
# 128 bytes and the published maxLength is exact.
REQUEST_ID = r"^[!-.0-\[\]-~]+$"


def not_blank_no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL")
    if not value.strip():
        raise ValueError("must not be blank")
    return value


class ChildCounts(Schema):
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    lost: int = 0
    total: int = 0


class RunCountsOut(ChildCounts):
    pass

"""Form errors as the dashboard shows them (issue 38): next to the field, with what was typed
kept, under the same limits as REST (NUL is refused in any text, as the API's strict input
refuses it with 422)."""

from __future__ import annotations

import re

from delegation.errors import RpcError, http_status

NUL_STATUS = 422  # what REST answers for the same input


def nul_field(values: dict[str, str]) -> str | None:
    """The first field whose text holds NUL: browsers send it, REST refuses it."""
    for name, value in values.items():
        if "\x00" in value:
            return name
    return None


def nul_message(name: str) -> str:
    return f"{name}: must not contain NUL"


def field_of(message: str, fields) -> str:
    """The form field a service's message names (``budget.maxLive: ...``, ``kinds[0]: ...``),
    or "" when it names none of them."""
    head = message.split(":", 1)[0].strip()
    head = re.sub(r"\[\d+\]$", "", head.rsplit(".", 1)[-1])
    return head if head in fields else ""


def refusal(exc: RpcError, fields) -> tuple[dict, int]:
    """A service's refusal as the form's error: ``({"error", "field"}, HTTP status)``."""
    return {"error": exc.message, "field": field_of(exc.message, fields)}, http_status(exc)[0]

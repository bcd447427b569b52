"""Conclusions (SPEC §9): what a run says it achieved, in one strict shape.

A child reports it through the MCP ``conclude`` tool, or (an agent without the tool) by ending
its final output with a fenced block tagged ``canopy-conclusion`` holding the same JSON. Both
are validated by :class:`Conclusion` here, so the two paths cannot drift apart. No Django
import: the runner, the formats and the server all read this module.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from delegation.errors import INVALID_PARAMS, RpcError
from delegation.protocol import KIB
from delegation.wire.decode import loads_strict, parse_model, refuse_nul, utf8_len
from delegation.wire.schemas import Strict

BLOCK_TAG = "canopy-conclusion"
STATUSES = ("done", "partial", "blocked", "failed")
MAX_SUMMARY_BYTES = 16 * KIB
MAX_TEXT_BYTES = 4 * KIB
MAX_ARTIFACTS = 64
MAX_FOLLOW_UPS = 32
# The whole conclusion, as stored JSON: it is also a conclusion event's input, which the
# stream keeps to 32 KiB a field, and it rides on every Result of the run.
MAX_CONCLUSION_BYTES = 32 * KIB


def _text(limit: int):
    def check(value: str) -> str:
        if value.strip() == "":
            raise ValueError("must not be blank")
        if utf8_len(value) > limit:
            raise ValueError(f"must be at most {limit} bytes of UTF-8")
        return value

    return AfterValidator(check)


Text = Annotated[str, _text(MAX_TEXT_BYTES)]


def _url(value: str) -> str:
    # Shown as a link on the run page: only web addresses, never javascript: or file:.
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("must be an http or https URL")
    return value


class Artifact(Strict):
    """Something the run produced: a file in its workspace (``path``) or a ``url``."""

    path: Text = Field(default=None)
    url: Annotated[str, _text(MAX_TEXT_BYTES), AfterValidator(_url)] = Field(default=None)
    description: Text

    @model_validator(mode="after")
    def _names_something(self) -> Artifact:
        if self.path is None and self.url is None:
            raise ValueError("an artifact needs a path or a url")
        return self


def _confidence(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class Conclusion(Strict):
    """SPEC §9 ``conclude`` arguments; the same JSON as a ``canopy-conclusion`` block."""

    status: Literal["done", "partial", "blocked", "failed"]
    summary: Annotated[str, _text(MAX_SUMMARY_BYTES)]
    artifacts: list[Artifact] = Field(default_factory=list, max_length=MAX_ARTIFACTS)
    follow_up: list[Text] = Field(default_factory=list, alias="followUp", max_length=MAX_FOLLOW_UPS)
    confidence: Annotated[float, Field(ge=0, le=1), AfterValidator(_confidence)] = Field(
        default=None
    )

    @model_validator(mode="after")
    def _bounded(self) -> Conclusion:
        size = utf8_len(json.dumps(self.stored(), ensure_ascii=False, separators=(",", ":")))
        if size > MAX_CONCLUSION_BYTES:
            raise ValueError(
                f"a conclusion must be at most {MAX_CONCLUSION_BYTES} bytes as JSON, got {size}"
            )
        return self

    def stored(self) -> dict:
        """The stored (and answered) shape: every list present, ``confidence`` when given."""
        out: dict[str, Any] = {
            "status": self.status,
            "summary": self.summary,
            "artifacts": [a.model_dump(by_alias=True, exclude_none=True) for a in self.artifacts],
            "followUp": list(self.follow_up),
        }
        if self.confidence is not None:
            out["confidence"] = self.confidence
        return out


def parse_conclusion(data: Any, prefix: str = "conclusion") -> dict:
    """Validate ``data`` strictly; the stored shape, or −32602 naming the field."""
    refuse_nul(data, prefix)
    return parse_model(Conclusion, data, prefix=prefix).stored()


# The last fenced block of the output, tagged canopy-conclusion, with nothing but
# whitespace after it: "a final output that ends with" the block (SPEC §9).
_BLOCK = re.compile(
    r"(?:^|\n)[ \t]*(```+|~~~+)[ \t]*" + BLOCK_TAG + r"[ \t]*\n(.*?)\n[ \t]*\1[ \t]*\s*\Z", re.S
)


def find_block(output: str) -> str | None:
    """The JSON text of the ``canopy-conclusion`` block ending ``output``, or None."""
    if not isinstance(output, str) or BLOCK_TAG not in output:
        return None
    match = _BLOCK.search(output)
    return match.group(2) if match else None


def conclusion_of_output(output: str) -> tuple[dict | None, str | None]:
    """``(conclusion, None)`` for a valid block, ``(None, reason)`` for an invalid one,
    ``(None, None)`` when the output ends with no block."""
    block = find_block(output)
    if block is None:
        return None, None
    prefix = BLOCK_TAG
    try:
        data = loads_strict(block)
    except RpcError as error:
        return None, f"{prefix}: not one JSON object ({error.message})"
    try:
        return parse_conclusion(data, prefix), None
    except RpcError as error:
        if error.code != INVALID_PARAMS:
            raise
        return None, error.message

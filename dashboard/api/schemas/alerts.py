"""Webhooks and their deliveries (SPEC §10), admins only."""

from __future__ import annotations

from typing import Annotated, Literal

from ninja import Schema
from pydantic import Field

from delegation.models import ALERT_KINDS
from delegation.wire import Strict

AlertKind = Literal[ALERT_KINDS]  # type: ignore[valid-type]
# What the service accepts, as closely as a pattern can say it: https anywhere (host names
# in any case, up to 253 characters; IPv6 literals, here only full ones in the public
# 2400::/6 blocks the registries hand out, so that whatever the pattern generates the
# service accepts; it accepts any public one), or http to loopback; no credentials, no
# spaces, a port from 1 to 65535. The pattern is published for generators (the schema test
# generates from it) but not enforced here: the service checks the URL with a URL parser
# and answers a message a person can read, where a pattern mismatch would answer the regex.
_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
URL_PATTERN = (
    r"^(https://([A-Za-z]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[2[4-9a-f][0-9a-f]{2}(:[0-9a-f]{1,4}){7}\])"
    r"|http://(127\.0\.0\.1|localhost|\[::1\]))(:" + _PORT + r")?(/[!-~]{0,200})?$"
)


class WebhookBody(Strict):
    """A new webhook. Omit `secret` to have one made; it is answered once, here."""

    url: Annotated[str, Field(max_length=2048)] = Field(
        json_schema_extra={"pattern": URL_PATTERN},
        description="HTTPS to a public address, or plain HTTP to loopback only (127.0.0.1, "
        "::1, localhost); never a private, link-local or cloud metadata address",
    )
    kinds: Annotated[list[AlertKind], Field(min_length=1, max_length=16)] = Field(
        description="Which alerts to send: " + ", ".join(ALERT_KINDS)
    )
    secret: Annotated[str, Field(pattern=r"^[!-~]{16,256}$")] = Field(
        default=None, description="HMAC key, 16 to 256 printable ASCII characters"
    )
    active: bool = True
    name: Annotated[str, Field(max_length=128, pattern=r"^[^\x00]*$")] = ""


class WebhookItem(Schema):
    id: int
    name: str
    url: str
    kinds: list[str]
    active: bool
    createdAt: str  # noqa: N815
    createdBy: str  # noqa: N815


class WebhookCreated(WebhookItem):
    secret: str = Field(description="The signing secret; not shown again")


class WebhookPage(Schema):
    items: list[WebhookItem]
    next: str | None


class AttemptItem(Schema):
    number: int
    startedAt: str  # noqa: N815
    durationMs: int  # noqa: N815
    statusCode: int | None  # noqa: N815
    error: str


class DeliveryItem(Schema):
    id: int
    deliveryId: str  # noqa: N815
    webhook: int
    kind: str
    state: str = Field(description="pending, delivered or given-up")
    attempts: list[AttemptItem]
    createdAt: str  # noqa: N815
    nextAttemptAt: str | None  # noqa: N815
    deliveredAt: str | None  # noqa: N815
    body: str = Field(description="The exact body sent (and signed)")


class DeliveryPage(Schema):
    items: list[DeliveryItem]
    next: str | None

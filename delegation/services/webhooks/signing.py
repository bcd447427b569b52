"""How a delivery is signed, and how a receiver checks it (HMAC-SHA256 of the body with the
webhook's secret; a second signature binds the attempt's timestamp against replays)."""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Canopy-Signature"
TIMESTAMP_HEADER = "X-Canopy-Timestamp"
TIMESTAMP_SIGNATURE_HEADER = "X-Canopy-Timestamp-Signature"
# How old a timestamp ``verify_timestamped`` still accepts (a receiver's choice; this is ours).
TIMESTAMP_TOLERANCE_SECONDS = 300


def sign(secret: str, body: bytes) -> str:
    """The ``X-Canopy-Signature`` value: ``sha256=`` and the hex HMAC-SHA256 of the body."""
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify(secret: str, body: bytes, header: str) -> bool:
    """What a receiver does (constant-time comparison of the whole header value)."""
    return hmac.compare_digest(sign(secret, body), header or "")


def sign_timestamped(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Canopy-Timestamp-Signature`` value: ``sha256=`` and the hex HMAC-SHA256 of
    ``<timestamp>.<body>``, so the signature holds only with the timestamp it was sent with."""
    return sign(secret, timestamp.encode("ascii") + b"." + body)


def verify_timestamped(
    secret: str,
    body: bytes,
    timestamp: str,
    header: str,
    *,
    now: float | None = None,
    tolerance: float = TIMESTAMP_TOLERANCE_SECONDS,
) -> bool:
    """What a receiver does against replays: the signature matches and the timestamp is recent."""
    try:
        sent = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs((time.time() if now is None else now) - sent) > tolerance:
        return False
    return hmac.compare_digest(sign_timestamped(secret, timestamp, body), header or "")

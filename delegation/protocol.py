"""Protocol constants every side of Canopy shares: the runner socket, the live socket, the SDK
and the reference runner's engines.

No Django and no third-party import, so the SDK and an agent host can use it as it is.
"""

KIB = 1024

# WebSocket close codes (4000-4999 are the application's own).
CLOSE_UNAUTHORIZED = 4401  # no credential, a wrong one, or one revoked while connected
CLOSE_FORBIDDEN = 4403  # a credential without the role the socket needs
CLOSE_FENCED = 4409  # a newer connection of the same runner took over
CLOSE_TOO_MANY = 4429  # a live socket over the per-user limit (an error frame says which)

# Frames: the runner protocol refuses text frames over 1 MiB (SPEC §5).
MAX_FRAME_BYTES = 1024 * KIB
# A steer message (SPEC §6): bytes of UTF-8, not characters. Every form and schema reads this.
MAX_STEER_BYTES = 10_000

# Event kinds only the server writes (SPEC §5); a runner may not send them.
SERVER_EVENT_KINDS = frozenset(
    {
        "steer",
        "steer-undelivered",
        "cancel-requested",
        "lease-released",
        "delegation-refused",
        # SPEC §10: stored on a budget's run at 80% of a limit, and when a limit is crossed.
        "budget-warning",
        "budget-exceeded",
        # SPEC §9: a run's stored conclusion (the conclude tool or a canopy-conclusion block).
        "conclusion",
    }
)


def bearer_token(headers) -> str:
    """The token of an `Authorization: Bearer ...` header among ASGI `(name, value)` pairs.

    Empty when the header is missing or names another scheme.
    """
    for key, value in headers:
        if key.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""

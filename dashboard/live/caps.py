"""What one socket and one user may hold: sockets per user, subscriptions per socket, frame
sizes and queued work. Every cap answers an ``error`` frame with code ``limit``."""

from __future__ import annotations

from django.conf import settings

# Inbound frames: larger ones are refused unread.
MAX_CLIENT_FRAME_CHARS = 64 * 1024
MAX_RUN_SUBSCRIPTIONS = 200
MAX_TREE_SUBSCRIPTIONS = 20
# Subscribe/unsubscribe frames waiting for the worker; more is a client not waiting for answers.
MAX_PENDING_JOBS = 256

# Open live sockets per user in this process (LIVE_MAX_SOCKETS_PER_USER).
_sockets_per_user: dict[int, int] = {}


def claim_socket(user_pk: int) -> str | None:
    """Count one more socket for the user; the refusal's message when they hold the limit."""
    limit = settings.LIVE_MAX_SOCKETS_PER_USER
    if _sockets_per_user.get(user_pk, 0) >= limit:
        return (
            f"too many live sockets: at most {limit} per user "
            "(LIVE_MAX_SOCKETS_PER_USER); close one first"
        )
    _sockets_per_user[user_pk] = _sockets_per_user.get(user_pk, 0) + 1
    return None


def release_socket(user_pk: int) -> None:
    left = _sockets_per_user.get(user_pk, 1) - 1
    if left > 0:
        _sockets_per_user[user_pk] = left
    else:
        _sockets_per_user.pop(user_pk, None)

"""Typed errors: client-side failures, and one :class:`RpcError` subclass per SPEC code the
server answers with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from delegation import errors as codes
from delegation.errors import RpcError


class ClientError(Exception):
    """Something went wrong on the client side of the connection (not a server refusal)."""


class ClientTimeout(ClientError, TimeoutError):
    """No answer in time: the server was unreachable or silent for the whole call timeout."""


class ClientClosed(ClientError):
    """The client was closed (or gave up for good) while the call was waiting."""


class AuthenticationFailed(ClientError):
    """The server refused the runner token (close 4401 or an HTTP 401/403 handshake)."""


class Fenced(ClientError):
    """A newer connection of the same runner took over (close 4409); this one stops for good."""


class NotRegistered(RpcError):
    pass


class StaleConnection(RpcError):
    pass


class InvalidParams(RpcError):
    pass


class NotOwned(RpcError):
    pass


class NoSuchRun(RpcError):
    pass


class DepthLimitReached(RpcError):
    """−32010: the calling agent is at the cap. Soft: the model should finish the work itself."""


class AdmissionRefused(RpcError):
    pass


class PresetStale(RpcError):
    pass


class RequestIdReused(RpcError):
    pass


class ParentNotRunning(RpcError):
    pass


class LeaseGone(RpcError):
    pass


class ReleaseUnconfirmed(RpcError):
    """−32016: children under the lease have not confirmed yet; call release again."""


class BudgetExhausted(RpcError):
    """−32017: a budget of the caller or an ancestor allows no more (SPEC §10)."""


_ERROR_TYPES: dict[int, type[RpcError]] = {
    codes.NOT_REGISTERED: NotRegistered,
    codes.STALE_CONNECTION: StaleConnection,
    codes.INVALID_PARAMS: InvalidParams,
    codes.NOT_OWNED: NotOwned,
    codes.NO_SUCH_RUN: NoSuchRun,
    codes.DEPTH_LIMIT: DepthLimitReached,
    codes.ADMISSION_REFUSED: AdmissionRefused,
    codes.PRESET_STALE: PresetStale,
    codes.REQUEST_ID_REUSED: RequestIdReused,
    codes.PARENT_NOT_RUNNING: ParentNotRunning,
    codes.LEASE_GONE: LeaseGone,
    codes.RELEASE_UNCONFIRMED: ReleaseUnconfirmed,
    codes.BUDGET_EXHAUSTED: BudgetExhausted,
}


def error_from_wire(error: Any) -> RpcError:
    """The typed exception for a JSON-RPC ``error`` member."""
    if not isinstance(error, Mapping):
        return RpcError(codes.INTERNAL_ERROR, f"malformed error member: {error!r}")
    code = error.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        code = codes.INTERNAL_ERROR
    message = error.get("message")
    if not isinstance(message, str):
        message = str(message)
    return _ERROR_TYPES.get(code, RpcError)(code, message, error.get("data"))


def is_retryable(error: RpcError) -> bool:
    """Whether the server marked a failure as passing (``data.retryable``): send it again."""
    data = error.data
    return isinstance(data, Mapping) and data.get("retryable") is True


def retry_after(error: RpcError) -> float | None:
    """The seconds a saturated server asked the caller to wait before sending again
    (``data.retryAfterMs`` beside ``retryable``: back-pressure), or None."""
    data = error.data
    if not isinstance(data, Mapping):
        return None
    delay = data.get("retryAfterMs")
    if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
        return None
    return delay / 1000


class _ConnectionLost(Exception):
    """Internal: the connection a call was sent on went away before the answer came."""

"""JSON-RPC error codes of SPEC §6, and the one exception services raise to refuse a call."""

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
NOT_REGISTERED = -32001
STALE_CONNECTION = -32002
NOT_OWNED = -32003
NO_SUCH_RUN = -32004
DEPTH_LIMIT = -32010
ADMISSION_REFUSED = -32011
PRESET_STALE = -32012
REQUEST_ID_REUSED = -32013
PARENT_NOT_RUNNING = -32014
LEASE_GONE = -32015
RELEASE_UNCONFIRMED = -32016
BUDGET_EXHAUSTED = -32017


class RpcError(Exception):
    """A refusal with a SPEC error code and a message that names what was wrong."""

    def __init__(self, code: int, message: str, data=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def wire(self) -> dict:
        error = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error

    def __repr__(self):
        return f"RpcError({self.code}, {self.message!r})"


class PermissionRefused(Exception):
    """An operator (person or API token) whose role may not perform the action."""


# --- One error -> HTTP status map for every HTTP door (pages and REST) -----------------------

# SPEC §6 codes -> (HTTP status, REST envelope code). Anything not listed is a 400.
_HTTP_STATUS = {
    PARSE_ERROR: (400, "bad_request"),
    INVALID_REQUEST: (400, "bad_request"),
    INVALID_PARAMS: (422, "invalid"),
    NOT_OWNED: (404, "not_found"),
    NO_SUCH_RUN: (404, "not_found"),
    DEPTH_LIMIT: (409, "conflict"),
    ADMISSION_REFUSED: (409, "conflict"),
    PRESET_STALE: (409, "conflict"),
    REQUEST_ID_REUSED: (409, "conflict"),
    PARENT_NOT_RUNNING: (409, "conflict"),
    LEASE_GONE: (409, "conflict"),
    RELEASE_UNCONFIRMED: (409, "conflict"),
    BUDGET_EXHAUSTED: (409, "conflict"),
    NOT_REGISTERED: (409, "conflict"),
    STALE_CONNECTION: (409, "conflict"),
}
_UNLISTED = (400, "bad_request")
_REFUSED = (403, "forbidden")


def http_status(exc: Exception) -> tuple[int, str]:
    """The HTTP status and REST envelope code for a service's refusal.

    Pages and the REST API both answer with this, so one refusal gets one status whatever
    door it came through. ``exc`` is an ``RpcError`` or a ``PermissionRefused``.
    """
    if isinstance(exc, PermissionRefused):
        return _REFUSED
    if isinstance(exc, RpcError):
        return _HTTP_STATUS.get(exc.code, _UNLISTED)
    raise TypeError(f"not a service refusal: {exc!r}")

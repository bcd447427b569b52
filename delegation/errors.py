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

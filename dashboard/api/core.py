"""The REST API's plumbing: authentication, the error envelope, strict parsing, cursors.

Everything here is shared by the routers in this package. The rules (SPEC §7):

* A request authenticates with ``Authorization: Bearer <api token>`` or with the browser's
  Django session; a session request with an unsafe method must also pass Django's CSRF check
  (``X-CSRFToken`` header). A bearer header wins over a session cookie, and a bad bearer token
  is refused outright (it never falls back to the session).
* Every operation needs at least the viewer role; actions are then checked again (operator)
  by the engine's service functions, which also write the audit entry.
* Every error, whatever raised it, answers ``{"error": {"code", "message"}}`` (plus
  ``rpcCode`` when the engine refused with a SPEC §6 code) with the matching HTTP status.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.security.base import AuthBase
from ninja.utils import check_csrf
from pydantic import Field

from dashboard import sso
from delegation import roles
from delegation.errors import PermissionRefused, RpcError, http_status
from delegation.services import run_actions, tokens
from delegation.services.locks import is_lost_connection
from delegation.wire import loads_strict

log = logging.getLogger(__name__)


# --- The error envelope -----------------------------------------------------------------------


class ErrorDetail(Schema):
    code: str = Field(
        description="Stable machine-readable reason: bad_request, unauthenticated, forbidden, "
        "csrf_failed, not_found, method_not_allowed, invalid, conflict, too_many_requests, "
        "internal_error."
    )
    message: str = Field(description="What was wrong, naming the field or parameter.")
    rpcCode: int = Field(  # noqa: N815
        default=None,
        description="Present when the engine refused with a SPEC §6 JSON-RPC code.",
    )


class ErrorOut(Schema):
    error: ErrorDetail


class ApiError(Exception):
    """An HTTP refusal carrying the envelope's code and message."""

    def __init__(self, status: int, code: str, message: str, rpc_code: int | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.rpc_code = rpc_code


ERRORS_DOC = """
**Errors.** Every error answers `{"error": {"code": ..., "message": ...}}`; `message` names the
field or parameter at fault. When the engine refused an action with a SPEC §6 JSON-RPC code,
the envelope also carries `rpcCode`.

| HTTP | `code` | when |
|---|---|---|
| 400 | `bad_request` | body is not one JSON object (malformed, trailing data, duplicate keys, NaN) |
| 401 | `unauthenticated` | no credentials, or a bad/revoked bearer token |
| 403 | `forbidden` | authenticated without the viewer role; an action without the operator role (the refusal is audited) |
| 403 | `csrf_failed` | session-authenticated unsafe request without a valid CSRF token |
| 404 | `not_found` | no such run, session, runner or lease (also −32003, −32004) |
| 405 | `method_not_allowed` | wrong HTTP method for the path |
| 409 | `conflict` | −32013 requestId reused with a different message, −32011 admission caps (e.g. the 129th steer receipt of a child), −32010, −32012, −32014, −32015, −32016, −32017 budget exhausted |
| 409 | `edit_not_supported_by_door` | an allow with `updatedInput` for an approval whose door cannot run an edited input (`canEdit: false`: an ACP agent answers with an option id only) |
| 422 | `invalid` | a body field, query or path parameter broke a rule: unknown field, `null`, wrong type, out of range, bad cursor (also −32602) |
| 429 | `too_many_requests` | more NDJSON exports at once than `EXPORT_MAX_CONCURRENT_PER_USER` |
| 500 | `internal_error` | a bug; nothing is leaked |
"""


def error_body(code: str, message: str, rpc_code: int | None = None) -> dict:
    detail: dict[str, Any] = {"code": code, "message": message}
    if rpc_code is not None:
        detail["rpcCode"] = rpc_code
    return {"error": detail}


def _loc_text(loc) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


UNION_TAG_ERRORS = ("union_tag_not_found", "union_tag_invalid")


def _rule(item: dict) -> str:
    kind = item["type"]
    if kind == "union_tag_not_found":
        return "required field missing"
    if kind == "union_tag_invalid":
        return f"must be one of {item['ctx']['expected_tags']}, not {item['ctx']['tag']!r}"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field missing"
    if "input" in item and item["input"] is None:
        return "null is not allowed (omit the field instead)"
    if kind == "value_error" and item.get("ctx", {}).get("error") is not None:
        return str(item["ctx"]["error"])
    return item["msg"]


# operationIds are published (clients generate code from them), and ninja derives them from
# the view's module. These modules hold operations that lived in another before the routers
# were split per resource; their ids keep the module they were published under.
_PUBLISHED_MODULE = {
    "dashboard.api.run_actions": "dashboard.api.runs",
    "dashboard.api.sessions": "dashboard.api.resources",
    "dashboard.api.leases": "dashboard.api.resources",
    "dashboard.api.runners": "dashboard.api.resources",
    "dashboard.api.audit": "dashboard.api.resources",
}


class CanopyAPI(NinjaAPI):
    """NinjaAPI with validation messages that keep the one fact ninja drops (a ``null``), and
    operationIds that do not move when code moves between modules."""

    def get_openapi_operation_id(self, operation) -> str:
        module = operation.view_func.__module__
        module = _PUBLISHED_MODULE.get(module, module)
        return f"{module}_{operation.view_func.__name__}".replace(".", "_")

    def validation_error_from_error_contexts(self, error_contexts) -> ValidationError:
        problems = []
        for context in error_contexts:
            model = context.model
            source = model.__ninja_param_source__
            for item in context.pydantic_validation_error.errors(include_url=False):
                loc = model.__ninja_flatten_map_reverse__.get(item["loc"], item["loc"])
                # Body fields arrive wrapped in the parameter's name ("body"); drop it.
                if source == "body" and len(loc) >= 1:
                    loc = loc[1:]
                # Pydantic's internal markers (function-after[...]) are not field names.
                loc = tuple(p for p in loc if not (isinstance(p, str) and "[" in p))
                where = _loc_text(loc) or source
                if item["type"] in UNION_TAG_ERRORS:
                    # A body told apart by one field (a decision's "decision"): name that field.
                    where = item["ctx"]["discriminator"].strip("'")
                label = {"query": "query parameter ", "path": "path parameter "}.get(source, "")
                problems.append(f"{label}{where}: {_rule(item)}")
        return ValidationError(problems)


class StrictParser(Parser):
    """Bodies are decoded like runner frames: one JSON object, no duplicates, no NaN."""

    def parse_body(self, request: HttpRequest):
        try:
            data = loads_strict(request.body)
        except RpcError as exc:
            raise ApiError(400, "bad_request", f"body: {exc.message}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "bad_request", "body: must be one JSON object")
        return data


def install_error_handlers(api: NinjaAPI) -> None:
    def respond(request, status, code, message, rpc_code=None, headers=None):
        response = api.create_response(request, error_body(code, message, rpc_code), status=status)
        for key, value in (headers or {}).items():
            response[key] = value
        return response

    @api.exception_handler(ApiError)
    def _api_error(request, exc: ApiError):
        headers = {"WWW-Authenticate": 'Bearer realm="canopy"'} if exc.status == 401 else None
        return respond(request, exc.status, exc.code, exc.message, exc.rpc_code, headers)

    @api.exception_handler(AuthenticationError)
    def _unauthenticated(request, exc):
        return respond(
            request,
            401,
            "unauthenticated",
            "authentication required: send 'Authorization: Bearer <api token>' or sign in",
            headers={"WWW-Authenticate": 'Bearer realm="canopy"'},
        )

    @api.exception_handler(HttpError)
    def _http_error(request, exc: HttpError):
        # The body parser's failure arrives wrapped by ninja; keep our message.
        cause = exc.__cause__
        if isinstance(cause, ApiError):
            return _api_error(request, cause)
        code = {400: "bad_request", 401: "unauthenticated", 403: "forbidden"}.get(
            exc.status_code, "bad_request"
        )
        return respond(request, exc.status_code, code, str(exc))

    @api.exception_handler(ValidationError)
    def _invalid(request, exc: ValidationError):
        return respond(request, 422, "invalid", "; ".join(str(e) for e in exc.errors))

    @api.exception_handler(RpcError)
    def _rpc(request, exc: RpcError):
        status, code = http_status(exc)
        return respond(request, status, code, exc.message, exc.code)

    @api.exception_handler(PermissionRefused)
    def _refused(request, exc):
        status, code = http_status(exc)
        return respond(request, status, code, str(exc))

    @api.exception_handler(Http404)
    def _not_found(request, exc):
        return respond(request, 404, "not_found", str(exc) or "not found")

    @api.exception_handler(Exception)
    def _crash(request, exc):
        if is_lost_connection(exc):  # lost twice (the service retried once): say so
            log.warning("REST API: database unavailable on %s %s", request.method, request.path)
            answer = respond(request, 503, "unavailable", "database unavailable; retry")
            answer["Retry-After"] = "1"
            return answer
        log.exception("REST API error on %s %s", request.method, request.path)
        return respond(request, 500, "internal_error", "internal error; see the server log")


# --- What every router shares ----------------------------------------------------------------

# The error answers each kind of operation documents.
READ = {401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut}
LIST = {401: ErrorOut, 403: ErrorOut, 422: ErrorOut}
ACT = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


def has_nul(*values) -> bool:
    """PostgreSQL text cannot hold NUL: such a filter matches nothing, so answer that."""
    for value in values:
        if isinstance(value, str) and "\x00" in value:
            return True
        if isinstance(value, list) and has_nul(*value):
            return True
    return False


class NoParams(Schema):
    pass


# --- Authentication ---------------------------------------------------------------------------


def _require_viewer(user):
    if not roles.can_view(user):
        raise ApiError(
            403,
            "forbidden",
            f"user {user.get_username()!r} has no role; reading needs viewer, acting operator",
        )
    return user


class BearerToken(AuthBase):
    """``Authorization: Bearer <api token>`` (``manage.py api_token create USERNAME``)."""

    openapi_type = "http"
    openapi_scheme = "bearer"
    openapi_description = "An API token from `python manage.py api_token create USERNAME`."

    def __call__(self, request: HttpRequest):
        header = request.headers.get("Authorization")
        if not header:
            return None
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401, "unauthenticated", "Authorization header must be 'Bearer <api token>'"
            )
        user = tokens.authenticate_api_token(token.strip())
        if user is None:
            raise ApiError(401, "unauthenticated", "API token is unknown or revoked")
        # A token acts with its user's role: for a provider's user, as its groups say now.
        sso.recheck_user(user)
        request.user = user
        return _require_viewer(user)


class DjangoSession(AuthBase):
    """The dashboard's signed-in session; unsafe methods also need ``X-CSRFToken``."""

    openapi_type = "apiKey"
    openapi_in = "cookie"
    openapi_name = settings.SESSION_COOKIE_NAME
    openapi_description = (
        "The browser's Django session cookie. POST requests must also send the CSRF token "
        "in the `X-CSRFToken` header."
    )
    csrf = True  # tells ninja's docs page to send the CSRF token

    def __call__(self, request: HttpRequest):
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        if request.method not in ("GET", "HEAD", "OPTIONS", "TRACE"):
            if check_csrf(request) is not None:
                raise ApiError(
                    403,
                    "csrf_failed",
                    "CSRF check failed: send the csrftoken cookie's value in X-CSRFToken",
                )
        return _require_viewer(user)


AUTH = [BearerToken(), DjangoSession()]


def actor_for(request):
    return run_actions.Actor.for_user(request.auth, via="api")


# --- Strict query strings ---------------------------------------------------------------------


def strict_query(*schemas, lists=()):
    """Refuse unknown and repeated query parameters (a typo must not widen a filter)."""
    allowed: set[str] = set()
    repeatable: set[str] = set(lists)
    for schema in schemas:
        for name, info in schema.model_fields.items():
            allowed.add(info.alias or name)
    allowed |= repeatable

    def decorate(view):
        @functools.wraps(view)
        def wrapper(request, *args, **kwargs):
            for key in request.GET:
                if key not in allowed:
                    known = ", ".join(sorted(allowed)) or "none"
                    raise ApiError(
                        422,
                        "invalid",
                        f"query parameter {key}: unknown parameter (known: {known})",
                    )
                if key not in repeatable and len(request.GET.getlist(key)) > 1:
                    raise ApiError(422, "invalid", f"query parameter {key}: given more than once")
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


# --- Cursors ----------------------------------------------------------------------------------

DEFAULT_LIMIT = 100
BIGINT_MAX = 2**63 - 1


def encode_cursor(kind: str, key: int) -> str:
    """A page position: the list's letter and the key in hex (``r1f4``).

    Clients treat it as opaque. It is kept this simple on purpose: the OpenAPI document can
    then state exactly which strings are cursors (``^r[0-9a-f]{1,16}$``), so any cursor the
    schema admits is one the server accepts.
    """
    return f"{kind}{key:x}"


def decode_cursor(kind: str, cursor: str | None) -> int | None:
    """The key inside a cursor of this list (the schema pattern was already checked)."""
    if cursor is None:
        return None
    if not cursor.startswith(kind):
        raise ApiError(422, "invalid", "query parameter cursor: not a cursor of this list")
    try:
        key = int(cursor[len(kind) :], 16)
    except ValueError:
        raise ApiError(422, "invalid", "query parameter cursor: not a cursor") from None
    # Past the largest key a database holds: the same as the largest key.
    return min(key, BIGINT_MAX)


def keyset_page(rows, kind: str, cursor: str | None, limit: int, descending: bool = True):
    """One page of ``rows`` (a queryset of dicts with ``pk``) after ``cursor``, by pk.

    Keyset pagination on the primary key: stable under concurrent inserts (new rows get
    larger keys, so with newest-first order they land before page one, never inside a page
    already served) and one indexed range scan per page, never an OFFSET.
    """
    after = decode_cursor(kind, cursor)
    if descending:
        rows = rows.order_by("-pk")
        if after is not None:
            rows = rows.filter(pk__lt=after)
    else:
        rows = rows.order_by("pk")
        if after is not None:
            rows = rows.filter(pk__gt=after)
    items = list(rows[: limit + 1])
    following = None
    if len(items) > limit:
        items = items[:limit]
        following = encode_cursor(kind, items[-1]["pk"])
    return {"items": items, "next": following}

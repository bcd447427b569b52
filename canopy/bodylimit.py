"""Request bodies bounded before anything reads them: before authentication, routing or Django.

Two layers, because daphne reads a whole request body (into memory, as one queued message per
8 KiB) before it calls the application, so an ASGI wrapper alone would see a 300 MB body only
once it is all in memory:

- under daphne, each Twisted request refuses a body over ``HTTP_MAX_BODY_BYTES`` as it arrives:
  from its ``Content-Length`` before a byte of the body is read, or while counting a chunked
  one. It answers 413 and closes the connection; nothing past the limit is kept;
- for any ASGI server, :class:`BodyLimit` refuses with 413, before the application is called,
  a ``Content-Length`` over the limit of its path (``/mcp`` has a tighter one), and counts the
  chunks of a body without one, answering 413 as soon as they pass it.

What no layer here can bound (the proxy in front has to): connection counts and request
rates, slow senders (a client trickling a body under the limit holds its connection),
the total of many bodies under the limit at once.
"""

from __future__ import annotations

import io
import json

# Under the largest body any page or the REST API takes (Django refuses form and JSON bodies
# over DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB, once it has them) with room to spare.
HTTP_MAX_BODY_BYTES = 4 * 1024 * 1024
# A tool call's arguments: a delegate message is at most 512 KiB of UTF-8, which JSON escapes
# (\uXXXX) can make up to a few times longer.
MCP_MAX_BODY_BYTES = 2 * 1024 * 1024


def _refusal(limit: int) -> bytes:
    return json.dumps(
        {"error": {"code": 413, "message": f"request body over {limit} bytes is refused"}}
    ).encode()


class BodyLimit:
    """ASGI wrapper: HTTP bodies over the limit of their path are answered 413, unread."""

    def __init__(self, app, *, default: int, paths: dict[str, int] | None = None):
        self.app = app
        self.default = default
        self.paths = {path.rstrip("/"): limit for path, limit in (paths or {}).items()}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.paths.get(scope["path"].rstrip("/"), self.default)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _send_413(send, limit)
            return
        if declared is not None or not _chunked(scope):
            # The server frames a declared length (or no body at all), so nothing past the
            # limit can arrive: the application keeps the server's own ``send``, which the
            # streamed responses' back-pressure (canopy.backpressure) must see to pace them.
            await self.app(scope, receive, send)
            return
        await self.app(scope, *_counting(receive, send, limit))


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _chunked(scope) -> bool:
    return any(
        name.lower() == b"transfer-encoding" and b"chunked" in value.lower()
        for name, value in scope.get("headers", [])
    )


def _counting(receive, send, limit: int):
    """``receive`` and ``send`` for the application: once the body passes ``limit`` the
    application is told the client left, and the client gets 413 (unless an answer began)."""
    state = {"received": 0, "refused": False, "started": False}

    async def limited_receive():
        message = await receive()
        if message["type"] == "http.request" and not state["refused"]:
            state["received"] += len(message.get("body", b""))
            if state["received"] > limit:
                state["refused"] = True
                if not state["started"]:
                    await _send_413(send, limit)
                return {"type": "http.disconnect"}
        return message

    async def guarded_send(message):
        if state["refused"]:
            return  # the client has its 413; nothing the application says reaches it
        if message["type"] == "http.response.start":
            state["started"] = True
        await send(message)

    return limited_receive, guarded_send


async def _send_413(send, limit: int) -> None:
    body = _refusal(limit)
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def install_daphne_body_limit(limit: int = HTTP_MAX_BODY_BYTES) -> None:
    """Make daphne's requests refuse a body over ``limit`` while it arrives (see above).

    Daphne builds each request from ``daphne.http_protocol.WebRequest`` when a connection sends
    one; this replaces that class with a subclass, once, when the ASGI application is imported
    (daphne imports it before it serves). Without daphne installed there is nothing to do.
    """
    try:
        from daphne import http_protocol
    except ImportError:  # pragma: no cover - another ASGI server; BodyLimit still holds
        return
    if getattr(http_protocol.WebRequest, "body_limit", None) is not None:
        return
    http_protocol.WebRequest = _limited_request(http_protocol.WebRequest, limit)


def _limited_request(base, limit: int):
    class LimitedWebRequest(base):
        body_limit = limit
        _received = 0
        _refused = False

        def __init__(self, *args, **kwargs):
            # Twisted would parse a multipart POST body itself (into ``args``, which daphne never
            # reads) and answer a bare 400 for a malformed one, before Django, authentication
            # or the REST API's error envelope ever see the request.
            kwargs["parsePOSTFormSubmission"] = False
            super().__init__(*args, **kwargs)

        def gotLength(self, length):  # noqa: N802 - Twisted's name
            # Called once the headers are in, before any of the body is read.
            if length is not None and length > self.body_limit:
                self._refuse()
                return
            super().gotLength(length)

        def handleContentChunk(self, data):  # noqa: N802 - Twisted's name
            if self._refused:
                return
            self._received += len(data)
            if self._received > self.body_limit:
                self._refuse()
                return
            super().handleContentChunk(data)

        def _refuse(self):
            self._refused = True
            old = getattr(self, "content", None)
            if old is not None:
                old.close()
            self.content = io.BytesIO()
            # Twisted answers "Expect: 100-continue" right after gotLength: not to this one.
            self.requestHeaders.removeHeader(b"Expect")
            body = _refusal(self.body_limit)
            self.channel.transport.write(
                b"HTTP/1.1 413 Content Too Large\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n"
                b"Connection: close\r\n\r\n" + body
            )
            # Stops reading at once and closes once the answer is written.
            self.channel.loseConnection()

        def process(self):
            if not self._refused:
                super().process()

        def connectionLost(self, reason):  # noqa: N802 - Twisted's name
            if self._refused:
                # Never handed to the application, so daphne has no record of it to close.
                from twisted.web import http

                http.Request.connectionLost(self, reason)
                return
            super().connectionLost(reason)

    return LimitedWebRequest

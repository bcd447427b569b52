"""Back-pressure for streamed HTTP responses under daphne.

ASGI has no flow control of its own: daphne's ``send`` hands each body chunk to Twisted,
which buffers whatever the client has not taken yet, so a streaming response to a client
that stops reading would pile the whole body up in server memory (an NDJSON export of
100 MB held 113 MB). This wrapper waits after each chunk until the client has taken enough
of what was already written, the way the live socket pauses; the response's iterator is not
advanced meanwhile, so no more rows are read from the database either. A client that
disconnects ends the wait: Django cancels the response on ``http.disconnect``.
"""

from __future__ import annotations

import asyncio

from django.conf import settings

from dashboard.live.backpressure import unsent_bytes

POLL_SECONDS = 0.02


def with_back_pressure(app):
    async def paced(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)

        async def send_paced(message):
            await send(message)
            if message["type"] == "http.response.body" and message.get("more_body"):
                limit = settings.HTTP_MAX_UNSENT_BYTES
                while True:
                    unsent = unsent_bytes(send)
                    if unsent is None or unsent <= limit:
                        return
                    await asyncio.sleep(POLL_SECONDS)

        return await app(scope, receive, send_paced)

    return paced

"""The operator live socket /ws/live/ in-process: a socket on a persona's session, and reading
its frames until one matches (SPEC §7)."""

from __future__ import annotations

import asyncio
import json

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from dashboard.live import frames as live_frames
from tests.support.personas import session_cookie

ORIGIN = (b"origin", b"http://127.0.0.1")


def live_socket(headers) -> WebsocketCommunicator:
    from canopy.asgi import application

    # A browser always sends Host; the Origin check compares the page's origin with it.
    if not any(name == b"host" for name, _ in headers):
        headers = [(b"host", b"127.0.0.1"), *headers]
    return WebsocketCommunicator(application, "/ws/live/", headers=headers)


async def operator_socket(operator) -> WebsocketCommunicator:
    """A live socket on a fresh session of the ``operator`` persona."""
    cookie = await database_sync_to_async(session_cookie)(operator)
    ws = live_socket([ORIGIN, (b"cookie", cookie)])
    connected, _ = await ws.connect(timeout=10)
    assert connected
    hello = await frame(ws)
    assert (
        hello["type"] == "hello"
        and hello["user"] == operator.username
        and hello["role"] == "operator"
    )
    return ws


async def frame(ws, timeout=5) -> dict:
    return json.loads(await ws.receive_from(timeout=timeout))


async def until(ws, predicate, timeout=8) -> list[dict]:
    """Frames up to and including the first one matching ``predicate``."""
    seen = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(f"no matching frame; saw {seen}")
        try:
            got = await frame(ws, remaining)
        except TimeoutError:
            continue
        seen.append(got)
        if predicate(got):
            return seen


def check_frames(frames):
    """Every server frame fits its declared pydantic model."""
    for f in frames:
        model = live_frames.SERVER_FRAMES[f["type"]]
        if model is not None:
            model.model_validate(f)

"""Finding 6: deeply nested JSON is a parse error on both sockets, never a dead socket."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from tests.support.personas import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

DEEP = "[" * 200_000


async def test_it_answers_32700_to_deep_nesting_and_keeps_the_runner_socket(runner):
    answer = await runner.raw_call(DEEP, None)
    assert answer["error"]["code"] == -32700, answer
    assert "nested deeper" in answer["error"]["message"]
    # Just past the limit, as a well-formed request: still a parse error, not a crash later.
    nested = "[" * 65 + "]" * 65
    frame = f'{{"jsonrpc":"2.0","id":7,"method":"run.open","params":{{"x":{nested}}}}}'
    answer = await runner.raw_call(frame, None)
    assert answer["error"]["code"] == -32700, answer
    pong = await runner.call("no.such.method")
    assert pong["error"]["code"] == -32601


async def test_it_sends_an_error_frame_for_deep_nesting_and_keeps_the_live_socket(operator):
    from canopy.asgi import application

    cookie = await database_sync_to_async(session_cookie)(operator)
    ws = WebsocketCommunicator(
        application,
        "/ws/live/",
        headers=[
            (b"host", b"127.0.0.1"),
            (b"origin", b"http://127.0.0.1"),
            (b"cookie", cookie),
        ],
    )
    connected, _ = await ws.connect(timeout=10)
    assert connected
    assert json.loads(await ws.receive_from(timeout=5))["type"] == "hello"
    await ws.send_to(text_data="[" * 60_000)  # under the live frame size limit
    error = json.loads(await ws.receive_from(timeout=10))
    assert error["type"] == "error" and "nested deeper" in error["message"], error
    await ws.send_json_to({"type": "ping"})
    assert json.loads(await ws.receive_from(timeout=5)) == {"type": "pong"}
    await ws.disconnect()

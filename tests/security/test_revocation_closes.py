"""A revoked or rotated runner token closes the runner's open socket within a second on every
process (issue 21), even when the channel-layer message that says so cannot reach it: here
the revocation comes from the test's own process, the socket lives in a daphne process, and
on SQLite they share no channel layer at all."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from asgiref.sync import sync_to_async

from delegation.protocol import CLOSE_UNAUTHORIZED
from delegation.services import tokens
from tests.support.rpc import DEFAULT_EXTENSION

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


async def _registered_socket(server, token: str):
    socket = await websockets.connect(
        server.ws_url,
        additional_headers={"Authorization": f"Bearer {token}"},
    )
    register = {"hostInstanceId": "host-1", "extensions": [DEFAULT_EXTENSION]}
    await socket.send(
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "runner.register", "params": register})
    )
    answer = json.loads(await socket.recv())
    assert answer["result"]["runnerId"] == "runner-far", answer
    return socket


async def _closed_within(socket, seconds: float) -> int | None:
    """The close code, if the server closes the socket within ``seconds`` (sending nothing)."""
    try:
        async with asyncio.timeout(seconds):
            async for _frame in socket:
                pass  # commands the server may still push before it closes
    except TimeoutError:
        return None
    except websockets.ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None
    return socket.close_code


@pytest.mark.parametrize("change", ["revoke", "rotate"])
async def test_it_closes_the_socket_of_a_revoked_or_rotated_runner_on_another_process(
    daphne_server, change
):
    _runner, token = await sync_to_async(tokens.create_runner)("runner-far")
    socket = await _registered_socket(daphne_server, token)
    try:
        if change == "revoke":
            assert await sync_to_async(tokens.revoke_runner)("runner-far")
        else:
            await sync_to_async(tokens.create_runner)("runner-far")  # a new token: rotation
        # Within a second of the commit, allowing the socket's close handshake on top.
        assert await _closed_within(socket, 1.5) == CLOSE_UNAUTHORIZED
    finally:
        await socket.close()

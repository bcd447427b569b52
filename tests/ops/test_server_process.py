"""The runner socket as served by a real daphne process, not only the ASGI app in-process."""

from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest
import websockets

from canopy.serving import ServerDidNotStart, start_server
from delegation.services import tokens

pytestmark = pytest.mark.django_db(transaction=True)


async def _call(ws, rpc_id, method, params):
    await ws.send(json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}))
    return json.loads(await asyncio.wait_for(ws.recv(), 10))


def test_it_refuses_a_frame_over_1_mib_and_keeps_the_connection_open(daphne_server):
    _runner, token = tokens.create_runner("big-frames")

    async def scenario():
        async with websockets.connect(
            daphne_server.ws_url,
            additional_headers={"Authorization": f"Bearer {token}"},
            max_size=None,
        ) as ws:
            registered = await _call(
                ws, 1, "runner.register", {"hostInstanceId": "h", "extensions": []}
            )
            assert registered["result"]["connectionGeneration"] == 1
            # Daphne's own default would drop this connection without a word.
            huge = {"conversationId": "c", "runId": "r", "profile": "x" * (2 * 1024 * 1024)}
            refused = await _call(ws, 2, "run.open", huge)
            assert refused["error"]["code"] == -32600
            assert "too large" in refused["error"]["message"]
            opened = await _call(ws, 3, "run.open", {"conversationId": "c", "runId": "r"})
            assert opened["result"]["runId"] == "r" and opened["result"]["profile"] == ""

    asyncio.run(scenario())


@pytest.mark.django_db  # the server never gets as far as the database
def test_it_reports_a_server_that_exits_instead_of_answering(tmp_path):
    # A port bound (not listening) by someone else: daphne cannot bind it and exits, while
    # nothing answers there, so only the exit can end the wait.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with (
            open(tmp_path / "daphne.log", "w") as log,
            pytest.raises(ServerDidNotStart, match="exited"),
        ):
            start_server("127.0.0.1", port, env=dict(os.environ), output=log, timeout=30)
    assert "Address already in use" in (tmp_path / "daphne.log").read_text()

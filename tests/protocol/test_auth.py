"""SPEC §5: the runner WebSocket handshake (Bearer token, close 4401) and frame limits."""

import json

import pytest
from channels.testing import WebsocketCommunicator

from delegation.models import Event, Runner
from delegation.services import tokens
from tests.support.rpc import adb, application, communicator
from tests.support.state import state

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1024 * 1024


async def _refused_handshake(ws: WebsocketCommunicator) -> int | None:
    """The close code of a refused handshake, whether refused before or after accept."""
    connected, code = await ws.connect(timeout=10)
    if not connected:
        return code
    output = await ws.receive_output(timeout=5)
    assert output["type"] == "websocket.close", output
    return output.get("code")


async def test_it_closes_with_4401_when_the_token_is_missing(runner_token):
    ws = communicator(None)
    assert await _refused_handshake(ws) == 4401


async def test_it_closes_with_4401_when_the_token_is_wrong(runner_token):
    ws = communicator(runner_token + "x")
    assert await _refused_handshake(ws) == 4401


async def test_it_closes_with_4401_when_the_scheme_is_not_bearer(runner_token):
    ws = WebsocketCommunicator(
        application(), "/ws/runner/", headers=[(b"authorization", f"Basic {runner_token}".encode())]
    )
    assert await _refused_handshake(ws) == 4401


async def test_it_closes_with_4401_for_a_revoked_token(runner_token):
    await adb(tokens.revoke_runner)("runner-a")
    assert await _refused_handshake(communicator(runner_token)) == 4401


async def test_it_closes_with_4401_for_an_empty_bearer(runner_token):
    ws = WebsocketCommunicator(
        application(), "/ws/runner/", headers=[(b"authorization", b"Bearer ")]
    )
    assert await _refused_handshake(ws) == 4401


async def test_it_stores_nothing_for_a_refused_handshake(runner_token):
    before = await state()
    ws = communicator("not-a-token")
    assert await _refused_handshake(ws) == 4401
    # Whatever the socket does afterwards, no runner state appears.
    assert await state() == before
    runner = await adb(Runner.objects.get)(name="runner-a")
    assert runner.connection_generation == 0 and not runner.connected


async def test_it_accepts_a_valid_token_and_answers_register(runner_token, make_client):
    client = await make_client(runner_token, register=False)
    result = await client.ok("runner.register", {"hostInstanceId": "h", "extensions": []})
    assert result == {"runnerId": "runner-a", "connectionGeneration": 1}


# --- frame size -------------------------------------------------------------------------------


def _run_event_frame(rpc_id, run_id: str, text: str, size: int | None = None) -> str:
    frame = {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "run.event",
        "params": {"runId": run_id, "from": 1, "events": [{"kind": "text", "text": text}]},
    }
    raw = json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
    if size is not None:
        pad = size - len(raw.encode("utf-8"))
        assert pad >= 0
        raw = raw[:-1] + " " * pad + "}"  # whitespace inside the object keeps it valid JSON
        assert len(raw.encode("utf-8")) == size
    return raw


async def test_it_refuses_a_frame_over_1_mib_with_32600_and_keeps_the_socket(runner):
    await runner.open("root-1")
    before = await state()
    answer = await runner.raw_call(_run_event_frame(None, "root-1", "x", MIB + 1), None)
    assert answer["error"]["code"] == -32600
    assert "large" in answer["error"]["message"] or "1048576" in answer["error"]["message"]
    assert await state() == before
    # The connection stays usable.
    assert await runner.emit("root-1", ["after"]) == {"emitted": 1, "sequence": 1}


async def test_it_accepts_a_frame_of_exactly_1_mib(runner):
    await runner.open("root-1")
    frame = _run_event_frame(77, "root-1", "y" * 1000, MIB)
    answer = await runner.raw_call(frame, 77)
    assert answer["result"] == {"emitted": 1, "sequence": 1}


async def test_it_counts_the_1_mib_limit_in_utf8_bytes(runner):
    await runner.open("root-1")
    # 400k three-byte characters: under 1 Mi characters, over 1 MiB of UTF-8.
    text = "\u20ac" * 400_000
    frame = _run_event_frame(5, "root-1", text)
    assert len(frame) < MIB < len(frame.encode("utf-8"))
    answer = await runner.raw_call(frame, None)
    assert answer["error"]["code"] == -32600
    assert await adb(Event.objects.count)() == 0


async def test_it_refuses_a_binary_frame(runner):
    await runner.open("root-1")
    before = await state()
    await runner.ws.send_to(bytes_data=json.dumps({"jsonrpc": "2.0", "id": 1}).encode())
    answer = await runner.reply_to(None)
    assert answer["error"]["code"] == -32600
    assert await state() == before
    assert (await runner.open("root-2"))["runId"] == "root-2"

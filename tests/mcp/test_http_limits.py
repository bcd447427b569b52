"""The HTTP door of a real daphne bounds what it takes before anyone is authenticated: a body
over the limit is refused as it arrives (never buffered whole), and ``GET /mcp`` is answered
at once (405: the server is stateless, there is no stream to hold open)."""

from __future__ import annotations

import asyncio

import httpx2
import pytest
from asgiref.sync import sync_to_async

from canopy.bodylimit import HTTP_MAX_BODY_BYTES, MCP_MAX_BODY_BYTES
from delegation.models import Run
from delegation.services import tokens
from tests.support.mcp_tools import LiveRunner

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

MB = 1024 * 1024


async def _status_line(reader: asyncio.StreamReader, timeout: float) -> bytes:
    return await asyncio.wait_for(reader.readline(), timeout)


async def _post_head(server, path: str, headers: dict[str, str]):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    return reader, writer


@pytest.mark.parametrize("path", ["/mcp", "/api/runs"])
async def test_it_refuses_a_300_mb_unauthenticated_post_before_its_body_arrives(
    daphne_server,
    path,
):
    """Only the headers and 64 KiB of a declared 300 MB body are sent: the answer comes anyway.
    A server that buffers the body first would wait for the other 299.9 MB and never answer."""
    reader, writer = await _post_head(
        daphne_server,
        path,
        {"Content-Type": "application/json", "Content-Length": str(300 * MB)},
    )
    try:
        writer.write(b"{" + b" " * (64 * 1024))
        await writer.drain()
        status = await _status_line(reader, timeout=10)
        rest = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    assert status.startswith(b"HTTP/1.1 413"), status
    assert f"over {HTTP_MAX_BODY_BYTES} bytes".encode() in rest
    # The connection is closed after the refusal: nothing more of the body is read.
    assert reader.at_eof()


async def test_it_refuses_a_chunked_body_once_it_passes_the_limit(daphne_server):
    """Without a Content-Length the body is counted as it arrives; past the limit the client
    is answered 413 while still sending (not 401 after the whole body was kept)."""
    reader, writer = await _post_head(
        daphne_server, "/mcp", {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    )
    chunk = b" " * (256 * 1024)
    sent = 0
    status = b""
    try:
        while sent < 64 * MB and not status:
            try:
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await asyncio.wait_for(writer.drain(), 5)
            except (ConnectionError, TimeoutError):
                break
            sent += len(chunk)
            if sent > HTTP_MAX_BODY_BYTES:
                try:
                    status = await _status_line(reader, timeout=0.2)
                except TimeoutError:
                    continue
        if not status:
            status = await _status_line(reader, timeout=10)
    finally:
        writer.close()
    assert status.startswith(b"HTTP/1.1 413"), (status, sent)
    assert sent < 2 * HTTP_MAX_BODY_BYTES, sent


def _tool_call(size: int) -> bytes:
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delegate",'
    body += b'"arguments":{"profile":"worker","message":"' + b"x" * size + b'"}}}'
    assert MCP_MAX_BODY_BYTES < len(body) < HTTP_MAX_BODY_BYTES
    return body


MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


async def test_it_refuses_an_mcp_body_over_its_own_limit_before_authentication(
    daphne_server,
):
    """/mcp takes less than the other paths: a 3 MiB tool call is 413, not the 401 of a
    missing token (a declared size is checked first, whoever sends it)."""
    async with httpx2.AsyncClient(timeout=20) as http:
        response = await http.post(
            f"{daphne_server.http_url}/mcp", content=_tool_call(3 * MB), headers=MCP_HEADERS
        )
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == 413


async def test_it_counts_a_chunked_mcp_body_as_it_is_read(daphne_server):
    """Without a declared length the body is counted as the MCP server reads it: a live run
    token's 3 MiB chunked tool call is 413 too, and no child is started."""
    token = await sync_to_async(tokens.create_runner)("limits-runner")
    body = _tool_call(3 * MB)

    async def chunks():
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024]

    async with LiveRunner(daphne_server, token[1]) as live:
        await live.open("root-1")
        issued = await live.run_token("root-1")
        headers = {**MCP_HEADERS, "Authorization": f"Bearer {issued['token']}"}
        async with httpx2.AsyncClient(timeout=20) as http:
            response = await http.post(issued["url"], content=chunks(), headers=headers)
    assert response.status_code == 413, response.text
    assert await sync_to_async(Run.objects.filter(parent__run_id="root-1").count)() == 0


async def test_it_answers_get_mcp_at_once_with_405(daphne_server):
    """A GET (the SSE stream of a stateful server) is answered now, not with the first ping
    15 s later, and whatever the token: there is no stream for a stateless server to push on."""
    async with httpx2.AsyncClient(timeout=5) as http:
        for headers in ({}, {"Authorization": "Bearer cnt_not-a-token"}):
            response = await http.get(
                f"{daphne_server.http_url}/mcp",
                headers={"Accept": "text/event-stream", **headers},
            )
            assert response.status_code == 405, response.text
            assert response.headers["allow"] == "POST"
            assert "stateless" in response.json()["error"]["message"]

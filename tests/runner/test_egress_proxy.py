"""The egress proxy's rules (SPEC §13), spoken to over its unix socket as the bridge does, with
a real upstream HTTP server that records every request it is sent."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from delegation.runner.egress import EgressProxy
from delegation.runner.egress_rules import check_allow_hosts


class Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, bytes]] = []

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while size := int(self.rfile.readline().strip(), 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        self.seen.append((self.command, self.path, body))
        out = b"ok " + self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.send_header("Connection", "keep-alive")
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


async def ask(proxy: EgressProxy, header: bytes, request: bytes, until: bytes = b"") -> bytes:
    """The answer to the end of the connection (the proxy closes after one request), or, for
    a raw tunnel, which the upstream keeps open, up to ``until``."""
    reader, writer = await asyncio.open_unix_connection(proxy.path)
    writer.write(header + request)
    await writer.drain()
    if until:
        answer = await asyncio.wait_for(reader.readuntil(until), 5)
    else:
        answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def started(allow=(), mcp_port=None) -> tuple[EgressProxy, list[str]]:
    refusals: list[str] = []
    url = f"http://127.0.0.1:{mcp_port}/mcp" if mcp_port else None
    proxy = EgressProxy(allow, mcp_url=url, report=refusals.append)
    await proxy.start()
    return proxy, refusals


async def test_it_forwards_one_request_to_mcp_and_not_the_one_riding_behind_it(upstream):
    proxy, refusals = await started(mcp_port=upstream)
    try:
        smuggled = (
            f"POST http://127.0.0.1:{upstream}/mcp HTTP/1.1\r\nHost: x\r\n"
            "Content-Length: 2\r\n\r\n{}"
            "GET /api/runners HTTP/1.1\r\nHost: x\r\n\r\n"
        ).encode()
        answer = await ask(proxy, b"PROXY\n", smuggled)
        assert answer.startswith(b"HTTP/1.0 200") or answer.startswith(b"HTTP/1.1 200"), answer
        assert b"Connection: close" in answer and answer.endswith(b"ok /mcp")
        assert Recorder.seen == [("POST", "/mcp", b"{}")]
        # On the bridge's loopback listener for the server's port: the same rule.
        chunked = (
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            b"GET /admin/ HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        answer = await ask(proxy, b"FORWARD %d 4\n" % upstream, chunked)
        assert answer.endswith(b"ok /mcp")
        assert Recorder.seen[-1] == ("POST", "/mcp", b"abcde") and len(Recorder.seen) == 2
        refused = await ask(proxy, b"FORWARD %d 4\n" % upstream, b"GET /api/x HTTP/1.1\r\n\r\n")
        assert refused.startswith(b"HTTP/1.1 403"), refused
        assert refusals == [f"network: refused 127.0.0.1:{upstream}: Canopy's server: only /mcp"]
    finally:
        await proxy.close()


async def test_it_refuses_a_name_that_resolves_to_loopback_and_reports_it_once(upstream):
    proxy, refusals = await started(allow=["localhost"])
    try:
        for _ in range(3):
            answer = await ask(proxy, b"PROXY\n", b"CONNECT localhost:443 HTTP/1.1\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 403"), answer
        assert len(refusals) == 1 and "is a loopback address" in refusals[0], refusals
        # A forged header naming a port no listener was given: refused, not relayed.
        answer = await ask(proxy, b"FORWARD %d 4\n" % upstream, b"GET / HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403") and Recorder.seen == []
    finally:
        await proxy.close()


async def test_it_reaches_a_loopback_model_the_preset_names_by_address_and_port(upstream):
    proxy, refusals = await started(allow=[f"127.0.0.1:{upstream}"])
    try:
        assert proxy.forward_ports == [upstream]
        plain = f"GET http://127.0.0.1:{upstream}/v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        assert (await ask(proxy, b"PROXY\n", plain.encode())).endswith(b"ok /v1/models")
        raw = b"GET /v1/x HTTP/1.1\r\nHost: x\r\n\r\n"
        tunnel = await ask(proxy, b"FORWARD %d 4\n" % upstream, raw, until=b"ok /v1/x")
        assert b"Connection: close" not in tunnel  # as it is: a tunnel, not read
        other = f"GET http://127.0.0.1:{upstream + 1}/ HTTP/1.1\r\n\r\n".encode()
        assert (await ask(proxy, b"PROXY\n", other)).startswith(b"HTTP/1.1 403")
        assert refusals == [
            f"network: refused 127.0.0.1:{upstream + 1}: not in the preset's allowHosts"
        ]
    finally:
        await proxy.close()


async def test_it_forwards_a_v6_loopback_grant_to_v6_not_to_whatever_holds_the_v4_port():
    # Two servers on one port number, one per loopback: the grant names the IPv6 one.
    class V6Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    class Named(Recorder):
        def _answer(self):
            out = f"ok {self.server.server_address[0]}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = _answer

    v6 = V6Server(("::1", 0), Named)
    port = v6.server_address[1]
    servers = [v6, ThreadingHTTPServer(("127.0.0.1", port), Named)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy, refusals = await started(allow=[f"[::1]:{port}"])
    try:
        raw = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        for version in (6, 4):  # "localhost" may resolve either way: both reach the grant
            answer = await ask(proxy, b"FORWARD %d %d\n" % (port, version), raw, until=b"::1")
            assert answer.endswith(b"ok ::1")
        other = await ask(proxy, b"FORWARD %d 6\n" % (port + 1), raw)
        assert other.startswith(b"HTTP/1.1 403")
        assert refusals == [f"network: refused [::1]:{port + 1}: not in the preset's allowHosts"]
    finally:
        await proxy.close()
        for server in servers:
            server.shutdown()


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("10.1.2.3", "is a private address: name its port too"),
        ("127.0.0.1", "is a loopback address: name its port too"),
        ("169.254.169.254:80", "is link-local (metadata)"),
        ("https://api.anthropic.com", "is not a host, *.domain or host:port"),
        ("api.*.com", "is not a host, *.domain or host:port"),
        ("api.anthropic.com:99999", "the port must be a number from 1 to 65535"),
    ],
)
def test_it_refuses_an_allow_hosts_entry_naming_the_preset(entry, words):
    with pytest.raises(ValueError, match=rf"^preset 'p': .*{re.escape(words)}"):
        check_allow_hosts([entry], label="preset 'p'")


def test_it_takes_the_allow_hosts_forms_the_docs_give():
    good = ["api.anthropic.com", "*.githubcopilot.com", "127.0.0.1:8765", "[::1]:11434"]
    assert check_allow_hosts(good, label="p") == tuple(good)

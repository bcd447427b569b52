"""The egress proxy a sandboxed agent reaches the outside through (SPEC §13).

Under ``"network": "proxy"`` (the default of every sandboxed preset) the agent has its own
network namespace: nothing but loopback. The runner runs one :class:`EgressProxy` per child on
a unix socket bound into its sandbox; :mod:`delegation.runner.egress_bridge` relays the agent's
TCP connections to it. What it lets through:

- ``CONNECT host:port`` (HTTPS) and absolute-form HTTP requests to a host the preset lists in
  ``allowHosts``;
- Canopy's own MCP URL, and on the server's address and port nothing but its path: plain HTTP
  is read request by request (one request per connection, so no second request rides along
  unchecked).

It resolves names itself, checks every address, and connects to the address it checked (no
DNS rebinding between check and connect): loopback, private, link-local (cloud metadata),
multicast, reserved and IPv6 forms that carry an IPv4 address are refused unless the preset
names that very address and port (``"127.0.0.1:8080"``: a local model server is the operator's
decision). Every refusal is reported through ``report`` with the host and the reason; the
engines make it an ``error`` event of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlsplit

from delegation.runner.egress_rules import Endpoint, Grant, address_problem, split_host_port

log = logging.getLogger("canopy.runner.egress")

HEAD_LIMIT = 64 * 1024
# The bridge the sandbox starts first (standard library only). It is copied into the proxy's
# own directory, which the sandbox binds anyway: binding it in place from the source tree
# failed wherever the agent cannot traverse the checkout (a clone under a 0700 directory).
BRIDGE_SOURCE = Path(__file__).with_name("egress_bridge.py")
CHUNK = 65536
CONNECT_TIMEOUT = 10.0
# Refusals reported per child: a hostile agent must not flood its run's event stream.
MAX_REPORTS = 50
# The bridge's header for a loopback port: the port and the IP version the agent dialled.
FORWARD_LINE = re.compile(rb"FORWARD (\d{1,5}) ([46])\n")
# Hop-by-hop headers: the proxy's own connection to the upstream is one request long.
HOP_HEADERS = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authorization",
    b"te",
    b"upgrade",
    b"expect",
}


class Refused(Exception):
    """A destination the proxy does not connect to; the message says why."""


class Unreachable(Exception):
    """An allowed destination that did not answer (502, not a refusal)."""


class EgressProxy:
    """One child's proxy: ``start()`` binds the socket in a private directory beside a copy of
    the bridge, ``close()`` removes them all. ``forward_ports`` are the loopback ports the
    bridge listens on."""

    def __init__(
        self,
        allow_hosts: Iterable[str],
        *,
        mcp_url: str | None,
        report: Callable[[str], None],
        owner: tuple[int, int] | None = None,
    ):
        self.grants = [Grant.parse(e) for e in allow_hosts]
        self.mcp = Endpoint.of(mcp_url) if mcp_url else None
        self.report = report
        self.owner = owner
        self.reported: set[str] = set()
        self.directory = ""
        self.path = ""
        self.bridge = ""
        self.server: asyncio.AbstractServer | None = None
        self.mcp_addresses: set[str] = set()
        self.tasks: set[asyncio.Task] = set()

    # -- what the bridge listens on -----------------------------------------------------

    @property
    def forward_ports(self) -> list[int]:
        ports = []
        if self.mcp and _is_loopback_name(self.mcp.host):
            ports.append(self.mcp.port)
        for grant in self.grants:
            literal = grant.literal
            if literal is not None and literal.is_loopback and grant.port:
                ports.append(grant.port)
        return sorted(set(ports))

    def proxy_port(self) -> int:
        taken = set(self.forward_ports)
        return next(p for p in (3128, 3129, 8118, 18080, 28080) if p not in taken)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="canopy-net-")
        self.path = os.path.join(self.directory, "egress.sock")
        self.bridge = os.path.join(self.directory, BRIDGE_SOURCE.name)
        shutil.copyfile(BRIDGE_SOURCE, self.bridge)
        os.chmod(self.bridge, 0o444)  # stays the runner's: the agent's account only reads it
        self.server = await asyncio.start_unix_server(self._serve, self.path, limit=HEAD_LIMIT)
        if self.owner:
            # The agent runs as the preset's account: the socket is its, and no one else's. The
            # directory stays the runner's, only passable: an unsandboxed agent of the same
            # account must not swap the bridge that another of its children runs first.
            os.chmod(self.directory, 0o711)
            os.chown(self.path, *self.owner)
            os.chmod(self.path, 0o600)
        if self.mcp:
            self.mcp_addresses = set(await _resolve(self.mcp.host, self.mcp.port))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        shutil.rmtree(self.directory, ignore_errors=True)

    def refuse(self, host: str, port: int, reason: str) -> Refused:
        message = f"network: refused {host}:{port}: {reason}"
        if message not in self.reported and len(self.reported) < MAX_REPORTS:
            self.reported.add(message)
            with contextlib.suppress(Exception):
                self.report(message)
        return Refused(message)

    # -- one connection -----------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.tasks.add(task)
        try:
            line = await reader.readline()
            if line == b"PROXY\n":
                await self._proxy(reader, writer)
            elif forward := FORWARD_LINE.fullmatch(line):
                port, version = int(forward[1]), int(forward[2])
                await self._forward(port, version, reader, writer)
        except Refused as exc:
            await _answer(writer, 403, str(exc))
        except Unreachable as exc:
            await _answer(writer, 502, str(exc))
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, ValueError) as exc:
            await _answer(writer, 400, f"canopy egress: {exc}")
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.tasks.discard(task)
            writer.close()

    def forward_address(self, port: int, version: int) -> str | None:
        """The loopback address a granted port is reached on: the one the agent connected to
        (IPv4 or IPv6) when the preset names it, else the one it names."""
        named = {
            str(grant.literal): grant.literal.version
            for grant in self.grants
            if grant.literal is not None and grant.literal.is_loopback and grant.port == port
        }
        same = [address for address, v in named.items() if v == version]
        return (same or sorted(named) or [None])[0]

    async def _forward(self, port: int, version: int, reader, writer) -> None:
        """A connection to a loopback port inside the sandbox: Canopy's server (HTTP, its MCP
        path only) or a model endpoint the preset names by address and port (as it is)."""
        if self.mcp and _is_loopback_name(self.mcp.host) and port == self.mcp.port:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, headers = _parse_head(head)
            if not self.mcp.allows_path(target):
                raise self.refuse(self.mcp.host, port, f"Canopy's server: only {self.mcp.path}")
            upstream = await self._open(self.mcp.host, port)
            await _exchange(method, target, headers, reader, writer, upstream)
            return
        address = self.forward_address(port, version)
        if address is None:
            loopback = "127.0.0.1" if version == 4 else "[::1]"
            raise self.refuse(loopback, port, "not in the preset's allowHosts")
        upstream = await self._open(address, port)
        await _splice(reader, writer, *upstream)

    async def _proxy(self, reader, writer) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, headers = _parse_head(head)
        if method == b"CONNECT":
            host, port = split_host_port(target, default=443)
            address = await self.destination(host.lower(), port, path=None)
            upstream = await self._open(address, port)
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
            await _splice(reader, writer, *upstream)
            return
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("a proxy request is CONNECT host:port or an http:// URL")
        port = parts.port or 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        address = await self.destination(parts.hostname.lower(), port, path=path)
        upstream = await self._open(address, port)
        await _exchange(method, path, headers, reader, writer, upstream)

    async def destination(self, host: str, port: int, *, path: str | None) -> str:
        """The address to connect to for ``host:port``, or :class:`Refused`. ``path`` is the
        HTTP request's (None for CONNECT: a tunnel's requests cannot be read)."""
        addresses = await self._addresses(host, port)
        if (
            self.mcp
            and port == self.mcp.port
            and (host == self.mcp.host or self.mcp_addresses & set(addresses))
        ):
            # Canopy's own server: its MCP path, nothing else of it. Over TLS (an https MCP
            # URL) the path is inside the tunnel: the tunnel is allowed, the server's own
            # authentication is what stands (docs/explanation/spec-deviations.md).
            if path is None and self.mcp.scheme == "https":
                return addresses[0]
            if path is not None and self.mcp.allows_path(path):
                return addresses[0]
            raise self.refuse(host, port, f"Canopy's server: only {self.mcp.path}")
        grant = next((g for g in self.grants if g.matches(host, port)), None)
        if grant is None:
            raise self.refuse(host, port, "not in the preset's allowHosts")
        if grant.literal is not None and grant.port is not None:
            return addresses[0]  # named by address and port: the operator's decision
        for address in addresses:
            problem = address_problem(ipaddress.ip_address(address))
            if problem:
                raise self.refuse(host, port, f"{address} is {problem}")
        return addresses[0]

    async def _addresses(self, host: str, port: int) -> list[str]:
        try:
            found = await _resolve(host, port)
        except OSError as exc:
            raise self.refuse(host, port, f"name not resolved ({exc.strerror or exc})") from None
        if not found:
            raise self.refuse(host, port, "name not resolved")
        return found

    async def _open(self, address: str, port: int):
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                return await asyncio.open_connection(address, port, limit=HEAD_LIMIT)
        except (OSError, TimeoutError) as exc:
            raise Unreachable(f"canopy egress: {address}:{port} did not answer ({exc})") from None


def _is_loopback_name(host: str) -> bool:
    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


async def _resolve(host: str, port: int) -> list[str]:
    with contextlib.suppress(ValueError):
        return [str(ipaddress.ip_address(host))]
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    out: list[str] = []
    for *_, sockaddr in infos:
        if sockaddr[0] not in out:
            out.append(sockaddr[0])
    return out


def _parse_head(head: bytes) -> tuple[bytes, str, list[tuple[bytes, bytes]]]:
    lines = head[:-4].split(b"\r\n")
    request = lines[0].split(b" ")
    if len(request) != 3 or not request[2].startswith(b"HTTP/1."):
        raise ValueError("not an HTTP/1.x request line")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise ValueError("a malformed header line")
        headers.append((name, value.strip()))
    return request[0], request[1].decode("latin-1"), headers


async def _exchange(method: bytes, target: str, headers, reader, writer, upstream) -> None:
    """One HTTP request to ``upstream`` and its whole answer; the connection ends with it."""
    up_reader, up_writer = upstream
    try:
        names = {name.lower(): value for name, value in headers}
        if names.get(b"expect", b"").lower() == b"100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        out = [method + b" " + target.encode("latin-1") + b" HTTP/1.1"]
        out += [n + b": " + v for n, v in headers if n.lower() not in HOP_HEADERS]
        out.append(b"Connection: close")
        up_writer.write(b"\r\n".join(out) + b"\r\n\r\n")
        await _copy_body(names, reader, up_writer)
        await up_writer.drain()
        head = await up_reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        kept = [lines[0]] + [
            line for line in lines[1:] if line.partition(b":")[0].strip().lower() not in HOP_HEADERS
        ]
        writer.write(b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n")
        # The answer's own framing, not the upstream's close: a server may keep the
        # connection open whatever the request said.
        status = lines[0].split(b" ", 2)[1] if lines[0].count(b" ") else b""
        answer = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(b":") for line in lines[1:])
        }
        if method == b"HEAD" or status in (b"204", b"304") or status.startswith(b"1"):
            return
        if b"content-length" in answer or b"chunked" in answer.get(b"transfer-encoding", b""):
            await _copy_body(answer, up_reader, writer)
            await writer.drain()
            return
        while data := await up_reader.read(CHUNK):  # framed by the close (an event stream)
            writer.write(data)
            await writer.drain()
    finally:
        up_writer.close()


async def _copy_body(names: dict, reader: asyncio.StreamReader, sink) -> None:
    """Exactly the request's body (by length or chunks), and not a byte after it."""
    if b"chunked" in names.get(b"transfer-encoding", b"").lower():
        while True:
            size_line = await reader.readuntil(b"\r\n")
            sink.write(size_line)
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                    sink.write(trailer)
                sink.write(b"\r\n")
                return
            sink.write(await reader.readexactly(size + 2))
            await sink.drain()
    length = names.get(b"content-length")
    if length:
        left = int(length)
        while left > 0:
            data = await reader.read(min(CHUNK, left))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            sink.write(data)
            await sink.drain()
            left -= len(data)


async def _splice(reader, writer, up_reader, up_writer) -> None:
    async def pump(source, sink) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(CHUNK):
                sink.write(data)
                await sink.drain()
        with contextlib.suppress(OSError):
            if sink.can_write_eof():
                sink.write_eof()

    try:
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
    finally:
        up_writer.close()


async def _answer(writer, status: int, text: str) -> None:
    reason = {400: b"Bad Request", 403: b"Forbidden", 502: b"Bad Gateway"}[status]
    body = text.encode() + b"\n"
    with contextlib.suppress(OSError, RuntimeError):
        writer.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (status, reason, len(body), body)
        )
        await writer.drain()

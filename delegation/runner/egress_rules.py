"""What the egress proxy lets through (SPEC §13), as rules with no sockets in them: the
preset's ``allowHosts`` entries (:class:`Grant`), the addresses never reached unless named
(:func:`address_problem`), and Canopy's MCP URL (:class:`Endpoint`). The presets check them at
load; :mod:`delegation.runner.egress` applies them to each connection."""

from __future__ import annotations

import contextlib
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

# IPv6 ranges that carry an IPv4 address (NAT64, 6to4, Teredo, IPv4-compatible): where the
# IPv4 address inside goes depends on a translator, so none is an allowed destination.
EMBEDDING = tuple(
    ipaddress.ip_network(n)
    for n in ("64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32", "::/96")
)


def address_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an agent may not reach ``ip`` unless the preset names it, or None."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return address_problem(ip.ipv4_mapped)
        if any(ip in net for net in EMBEDDING):
            return "an IPv6 address that carries an IPv4 address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        return "not a unicast address"
    if ip.is_private or not ip.is_global:
        return "a private address"
    return None


@dataclass(frozen=True)
class Grant:
    """One ``allowHosts`` entry: ``host``, ``*.domain``, ``host:port`` or ``[v6]:port``."""

    host: str
    port: int | None

    @classmethod
    def parse(cls, entry: str) -> Grant:
        if "/" in entry:
            raise ValueError(f"allowHosts: {entry!r} is not a host, *.domain or host:port")
        host, port = split_host_port(entry, default=None)
        if (
            not host
            or any(c in host for c in "/@ ")
            or (host.count("*") and not host.startswith("*."))
        ):
            raise ValueError(f"allowHosts: {entry!r} is not a host, *.domain or host:port")
        return cls(host.lower().rstrip("."), port)

    @property
    def literal(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        with contextlib.suppress(ValueError):
            return ipaddress.ip_address(self.host)
        return None

    def matches(self, host: str, port: int) -> bool:
        if self.port is None and port not in (80, 443):
            return False
        if self.port is not None and port != self.port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and host != self.host[2:]
        if self.literal is not None:
            with contextlib.suppress(ValueError):
                return ipaddress.ip_address(host) == self.literal
        return host == self.host


def split_host_port(value: str, *, default: int | None) -> tuple[str, int | None]:
    """``host:port`` (``[v6]:port``) as (host, port); ``default`` when there is no port."""
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:
        host, port = value, ""  # a bare IPv6 address or a plain name
    if not port:
        return host, default
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r}: the port must be a number from 1 to 65535")
    return host, int(port)


def check_allow_hosts(raw, *, label: str) -> tuple[str, ...]:
    """A preset's ``allowHosts`` list, each entry checked (ValueError naming the preset)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(e, str) for e in raw):
        raise ValueError(f"{label}: 'allowHosts' must be a list of host names")
    for entry in raw:
        try:
            grant = Grant.parse(entry)
        except ValueError as exc:
            raise ValueError(f"{label}: {exc}") from None
        literal = grant.literal
        problem = address_problem(literal) if literal is not None else None
        if problem and grant.port is None:
            raise ValueError(
                f"{label}: 'allowHosts' entry {entry!r} is {problem}: name its port too "
                '("127.0.0.1:8080") to let an agent reach it'
            )
        if literal is not None and literal.is_link_local:
            raise ValueError(f"{label}: 'allowHosts' entry {entry!r} is link-local (metadata)")
    return tuple(raw)


@dataclass(frozen=True)
class Endpoint:
    """Canopy's MCP URL as the proxy checks it."""

    scheme: str
    host: str
    port: int
    path: str

    @classmethod
    def of(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, (parts.hostname or "").lower(), port, parts.path or "/")

    def allows_path(self, target: str) -> bool:
        path = target.split("?", 1)[0]
        return path == self.path or path == self.path.rstrip("/") + "/"

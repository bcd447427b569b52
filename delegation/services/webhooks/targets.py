"""Where a delivery may go: https to public addresses only, plain http to loopback only;
never a private, link-local, unspecified or cloud metadata address, whatever name points there.
``check_url`` runs when a webhook is saved, ``refused_address`` for every address the sender
(``delegation.webhooks``) connects to."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from delegation.errors import INVALID_PARAMS, RpcError
from delegation.services.webhooks.embedded_ipv4 import embedded_ipv4s

# Names of cloud instance metadata services (credentials live there); their addresses
# (169.254.169.254, fd00:ec2::254, 100.100.100.200) are refused as non-public anyway.
METADATA_NAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the system resolver; tests replace this function so
    that no name is looked up off the machine). Raises ``OSError`` when it does not resolve."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def refused_address(address: str, *, scheme: str) -> str | None:
    """Why a delivery may not go to ``address`` (an IP address as text), or None if it may:
    http goes to loopback only, https to public addresses only."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    if ip.version == 6:
        embedded = embedded_ipv4s(ip)
        for inner in embedded:
            reason = refused_address(str(inner), scheme=scheme)
            if reason is not None:
                return f"{ip} embeds {inner}: {reason}"
        if embedded:
            ip = embedded[0]
    if ip in METADATA_ADDRESSES:
        return f"{ip} is a cloud metadata address"
    if ip.is_loopback:
        if scheme == "http":
            return None
        return f"{ip} is loopback (for a receiver on this machine use http://127.0.0.1)"
    if scheme == "http":
        return f"{ip} is not loopback (http goes to this machine only)"
    if ip.is_unspecified:
        return f"{ip} is not a public address (it means this machine)"
    if ip.is_link_local:
        return f"{ip} is link-local"
    if ip.is_private:
        return f"{ip} is a private address"
    if not ip.is_global or ip.is_multicast:
        return f"{ip} is not a public address"
    return None


def check_target(scheme: str, host: str, port: int) -> None:
    """Refuse a host that is, or resolves to, an address a delivery may not go to.

    A name that does not resolve (yet) passes here: the sender resolves it again before
    every connection and refuses it then, so no lookup result is ever trusted for long.
    """
    if host.rstrip(".") in METADATA_NAMES:
        raise RpcError(INVALID_PARAMS, f"url: {host!r} is a cloud metadata service")
    try:
        ipaddress.ip_address(host)
        addresses = [host]
    except ValueError:
        try:
            addresses = resolve_host(host, port)
        except OSError:
            return
    for address in addresses:
        reason = refused_address(address, scheme=scheme)
        if reason is not None:
            shown = "" if address == host else f"{host!r} resolves to "
            raise RpcError(INVALID_PARAMS, f"url: {shown}{reason}")


def check_url(url: str) -> str:
    """HTTPS to a public address, or plain HTTP to this machine only (a secret must not cross
    a network in the clear); never an address inside the server's own networks."""
    if not isinstance(url, str) or not url.strip():
        raise RpcError(INVALID_PARAMS, "url: required")
    url = url.strip()
    if len(url) > 2048:
        raise RpcError(INVALID_PARAMS, "url: at most 2048 characters")
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"url: not a URL ({exc})") from None
    if not host:
        raise RpcError(INVALID_PARAMS, "url: has no host")
    if parts.username is not None or parts.password is not None:
        raise RpcError(INVALID_PARAMS, "url: must not carry credentials (use the secret)")
    if parts.scheme == "https":
        check_target("https", host, parts.port or 443)
        return url
    if parts.scheme == "http":
        if _loopback(host):
            check_target("http", host, parts.port or 80)
            return url
        raise RpcError(
            INVALID_PARAMS,
            f"url: http is allowed only to loopback (127.0.0.0/8, ::1, localhost), not {host!r}; "
            "use https",
        )
    raise RpcError(
        INVALID_PARAMS, f"url: scheme must be https (or http to loopback), not {parts.scheme!r}"
    )

"""The IPv4 addresses an IPv6 address reaches through a translator or a tunnel (issue 35): a
webhook target such as ``64:ff9b::a9fe:a9fe`` is, through a NAT64 gateway, 169.254.169.254,
though Python calls it global. Each is checked as that IPv4 address would be."""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv6Address

NAT64_PREFIX = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052 well-known prefix
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215 local-use translation
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated ::a.b.c.d
IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT ::ffff:0:a.b.c.d (RFC 2765)
# Where the IPv4 address sits under a local-use prefix depends on the translator's prefix
# length (RFC 6052 §2.2): bit ranges, counted from the left, for /48, /56 and /64 (/96 is
# the last 32 bits). Bits 64-71 (the "u" octet) are skipped.
NAT64_LAYOUTS = (((48, 64), (72, 88)), ((56, 64), (72, 96)), ((72, 104),))


def embedded_ipv4s(ip: IPv6Address) -> list[IPv4Address]:
    """The IPv4 addresses ``ip`` may reach, the most likely first; none for a plain IPv6
    address: mapped (::ffff:a.b.c.d), SIIT (::ffff:0:a.b.c.d), IPv4-compatible (::a.b.c.d),
    NAT64 (64:ff9b::a.b.c.d; under the local-use 64:ff9b:1::/48 every layout a translator
    may use), 6to4 (2002:AABB:CCDD::) and Teredo (the client's address, inverted)."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return [ip.teredo[1]]
    low32 = IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in NAT64_LOCAL:
        return [low32, *(_read_layout(int(ip), layout) for layout in NAT64_LAYOUTS)]
    if ip in NAT64_PREFIX or ip in IPV4_TRANSLATED:
        return [low32]
    # :: and ::1 are IPv6's own unspecified and loopback addresses, not IPv4-compatible ones.
    if ip in IPV4_COMPATIBLE and int(ip) > 1:
        return [low32]
    return []


def _read_layout(value: int, layout) -> IPv4Address:
    address = 0
    for start, end in layout:
        width = end - start
        address = (address << width) | ((value >> (128 - end)) & ((1 << width) - 1))
    return IPv4Address(address)

"""Daphne's socket writes go out when made (``canopy.direct_writes``, issue 39), and bytes
keep their order whatever the kernel takes: a Twisted TCP connection over a real socket pair,
with a reactor that only records what it is asked to watch."""

from __future__ import annotations

import socket

import pytest
from twisted.internet import abstract, tcp
from twisted.internet.protocol import Protocol

from canopy.direct_writes import install_direct_writes


class Reactor:
    """What a connection asks of its reactor when it buffers: watch me for writability."""

    def __init__(self):
        self.writers = set()

    def addWriter(self, writer):  # noqa: N802 - Twisted's name
        self.writers.add(writer)

    def removeWriter(self, writer):  # noqa: N802
        self.writers.discard(writer)

    def callLater(self, *args, **kwargs):  # noqa: N802
        raise AssertionError("not expected here")


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    reactor = Reactor()
    connection = tcp.Connection(ours, Protocol(), reactor)
    connection.connected = 1
    yield connection, theirs, reactor
    ours.close()
    theirs.close()


def received(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    out = b""
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


def test_it_sends_a_frame_at_once_without_asking_the_reactor(pair):
    install_direct_writes()
    connection, theirs, reactor = pair
    connection.write(b"frame one")
    assert received(theirs) == b"frame one"  # no reactor turn happened
    assert reactor.writers == set()  # and none was asked for


def test_it_buffers_what_the_kernel_does_not_take_and_keeps_the_order(pair):
    install_direct_writes()
    connection, theirs, reactor = pair
    connection.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = bytes(range(256)) * 4096  # 1 MiB: more than the socket takes at once
    connection.write(big)
    assert connection in reactor.writers  # the rest waits for writability, as Twisted does
    connection.write(b"after")  # must not overtake what is buffered
    got = received(theirs)
    assert 0 < len(got) < len(big)
    while connection in reactor.writers:  # the reactor's turns, by hand
        connection.doWrite()
        got += received(theirs)
    assert got == big + b"after"


def test_it_installs_once():
    install_direct_writes()
    first = abstract.FileDescriptor.write
    install_direct_writes()
    assert abstract.FileDescriptor.write is first and first.direct

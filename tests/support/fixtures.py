"""Fixtures shared across the suite, registered for every test by ``tests/conftest.py``.

The runner socket (``runner_token``, ``make_client``, ``runner``); the clean-up and
environment fixtures the modules that start real processes name in their ``pytestmark``
(``close_worker_connections``, ``no_declared_level``); operator live sockets over TCP
(``live_clients``); a TCP proxy and a private Redis to break (``proxies``,
``private_redis``).
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from delegation.services import tokens
from tests.support.fault_tools import RedisServer, TcpProxy
from tests.support.rpc import RpcClient, communicator
from tests.support.tcp_clients import LiveClient


@pytest.fixture
def runner_token(db):
    _runner, token = tokens.create_runner("runner-a")
    return token


@pytest.fixture
async def make_client(db):
    """Open runner connections; each is closed at the end of the test.

    Depends on ``db`` so the sockets close (and their consumers finish) before the database
    is flushed: a consumer still locking rows would deadlock PostgreSQL's TRUNCATE.
    """
    opened: list[RpcClient] = []

    async def make(token: str | None, depth: str | None = None, register=True, **kw):
        client = RpcClient(communicator(token, depth))
        connected, _ = await client.connect()
        assert connected
        opened.append(client)
        if register and token is not None:
            await client.register(**kw)
        return client

    yield make
    for client in opened:
        # A socket the server already closed (fenced, refused) has a finished, maybe
        # cancelled, application task: nothing left to close.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await client.close()


@pytest.fixture
async def runner(runner_token, make_client):
    return await make_client(runner_token)


@pytest.fixture
async def close_worker_connections():
    """Queries made through sync_to_async run in a worker thread with its own connection;
    close it, or PostgreSQL cannot drop the test database at the end of the session."""
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def no_declared_level(monkeypatch):
    """No delegation level inherited from the environment the suite runs in (an agent's
    shell), so the runners and agents the test starts begin at the top."""
    monkeypatch.delenv("PANDO_DELEGATION_DEPTH", raising=False)


@pytest.fixture
async def live_clients():
    """``open_live(url, token, **kw)`` → a connected operator live socket over TCP; all are
    closed after the test."""
    opened: list[LiveClient] = []

    async def open_live(url: str, token: str, **kw) -> LiveClient:
        client = LiveClient(url, token, **kw)
        opened.append(client)
        return await client.connect()

    yield open_live
    for client in opened:
        await client.close()


@pytest.fixture
def proxies():
    """``start(port)`` → a :class:`TcpProxy` in front of ``port`` (a load balancer a test
    can switch, refuse or cut); all are closed after the test."""
    started: list[TcpProxy] = []

    def start(target: int) -> TcpProxy:
        proxy = TcpProxy(target).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.close()


@pytest.fixture
def private_redis():
    """A ``redis-server`` of the test's own on a spare port, to stop and start (never the
    machine's shared one)."""
    redis = RedisServer()
    yield redis.start()
    redis.close()


@pytest.fixture
def shipped_prices(db):
    """The price table as a migrated database has it: a transactional test's flush empties
    the table the migration filled, so tests that price usage load the shipped list again."""
    from delegation.models import ModelPrice
    from delegation.services.price_list import ship

    ship(ModelPrice)

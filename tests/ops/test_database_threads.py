"""The hot paths' database calls (``delegation.database_threads``) check a connection's health
at most once a second, where channels' ``database_sync_to_async`` checks it on every call (a
``SELECT 1`` round trip before each group commit and each live read, issue 39). A connection
that failed is checked by Django as the failing call ends, whatever this module does."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.db import connection, connections

from delegation import database_threads
from delegation.models import Runner

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture
def checks(monkeypatch):
    """How many health checks the database connections made. Connections persist, as they do
    in a server (CONN_MAX_AGE; the suite closes them after each call)."""
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 60)
    made = []
    wrapper = type(connections["default"])
    real = wrapper.is_usable

    def counted(self):
        made.append(1)
        return real(self)

    monkeypatch.setattr(wrapper, "is_usable", counted)
    yield made
    # The shared sync thread's connection would outlive the test and its database.
    await_close = database_sync_to_async(connection.close, thread_sensitive=True)
    async_to_sync(await_close)()


def _query():
    return Runner.objects.count()


async def test_it_checks_a_connection_at_most_once_a_second(checks, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(database_threads, "_clock", lambda: now[0])
    call = database_threads.hot_database_call(_query, thread_sensitive=True)
    for _ in range(5):
        await call()
    assert len(checks) <= 1  # the first call on a connection may check it, no other
    before = len(checks)
    now[0] += 1.5
    await call()
    await call()
    assert len(checks) == before + 1  # a second later: checked once more


async def test_channels_alone_checks_on_every_call(checks):
    """What the module spares: without it, every call begins with a check."""
    call = database_sync_to_async(_query, thread_sensitive=True)
    await call()
    before = len(checks)
    for _ in range(3):
        await call()
    assert len(checks) == before + 3

"""The hot paths' database calls (``delegation.database_threads``) check a connection's health
at most once a second, where channels' ``database_sync_to_async`` checks it on every call (a
``SELECT 1`` round trip before each group commit and each live read, issue 39). A connection
that failed is checked by Django as the failing call ends, whatever this module does."""

from __future__ import annotations

import threading

import pytest
from channels.db import database_sync_to_async
from django.db import connection, connections

from delegation import database_threads
from delegation.models import Runner

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


async def _close_shared_thread_connection():
    # From the event loop, as the tests call: a sync fixture's async_to_sync would run this
    # on the main thread and close that thread's connection instead.
    # ``connection.close`` looked up there, not here: it names the looking thread's wrapper.
    await database_sync_to_async(lambda: connection.close(), thread_sensitive=True)()


@pytest.fixture
async def checks(monkeypatch):
    """The health checks made on the thread the test's calls run on. Connections persist, as
    they do in a server (CONN_MAX_AGE; the suite closes them after each call). The shared
    sync thread's connection is closed first, so it opens under these settings whatever an
    earlier test left open there, and checks from other threads (a server an earlier test
    left stopping) are not counted."""
    await _close_shared_thread_connection()
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 60)
    made = []
    wrapper = type(connections["default"])
    real = wrapper.is_usable

    def counted(self):
        made.append(threading.get_ident())
        return real(self)

    monkeypatch.setattr(wrapper, "is_usable", counted)
    yield made
    # The shared sync thread's connection would outlive the test and its database.
    await _close_shared_thread_connection()


def _query():
    Runner.objects.count()
    return threading.get_ident()


def _on(thread: int, checks: list) -> int:
    return sum(1 for ident in checks if ident == thread)


async def test_it_checks_a_connection_at_most_once_a_second(checks, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(database_threads, "_clock", lambda: now[0])
    call = database_threads.hot_database_call(_query, thread_sensitive=True)
    for _ in range(5):
        thread = await call()
    assert _on(thread, checks) <= 1  # the first call on a connection may check it, no other
    before = _on(thread, checks)
    now[0] += 1.5
    await call()
    await call()
    assert _on(thread, checks) == before + 1  # a second later: checked once more


async def test_channels_alone_checks_on_every_call(checks):
    """What the module spares: without it, every call begins with a check."""
    call = database_sync_to_async(_query, thread_sensitive=True)
    thread = await call()
    before = _on(thread, checks)
    for _ in range(3):
        await call()
    assert _on(thread, checks) == before + 3

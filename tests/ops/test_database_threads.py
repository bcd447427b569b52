"""The hot paths' database calls (``delegation.database_threads``) check a connection's health
at most once a second, where channels' ``database_sync_to_async`` checks it on every call (a
``SELECT 1`` round trip before each group commit and each live read, issue 39). A connection
that failed is checked by Django as the failing call ends, whatever this module does."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import ThreadSensitiveContext
from channels.db import database_sync_to_async
from django.db import connection, connections

from delegation import database_threads
from delegation.models import Runner

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture
def checks(monkeypatch):
    """The health checks made, by thread."""
    made = []
    wrapper = type(connections["default"])
    real = wrapper.is_usable

    def counted(self):
        made.append(threading.get_ident())
        return real(self)

    monkeypatch.setattr(wrapper, "is_usable", counted)
    return made


@contextlib.asynccontextmanager
async def own_database_thread(monkeypatch):
    """The test's thread-sensitive calls on a thread of its own, whose connection persists as
    in a server (CONN_MAX_AGE; the suite closes them after each call), closed before the
    thread goes: the process's shared sync thread carries whatever connection an earlier
    test left there. (The CI failures this test had were another leak: channels' test
    communicator left its no-op ``close_old_connections`` in place; tests/conftest.py puts
    channels' own back before every test.)"""
    executor = ThreadPoolExecutor(max_workers=1)
    try:
        async with ThreadSensitiveContext(executor=executor):
            settings_dict = await database_sync_to_async(
                lambda: connections["default"].settings_dict
            )()
            monkeypatch.setitem(settings_dict, "CONN_MAX_AGE", 60)
            try:
                yield
            finally:
                # ``connection.close`` looked up on that thread: it names the looker's wrapper.
                await database_sync_to_async(lambda: connection.close())()
    finally:
        executor.shutdown()


async def _state():
    """Why a count may be off: the thread's connection as the calls left it."""

    def read():
        db = connections["default"]
        return {
            "open": db.connection is not None,
            "health_check_enabled": db.health_check_enabled,
            "close_at": db.close_at,
            "conn_max_age": db.settings_dict["CONN_MAX_AGE"],
        }

    return await database_sync_to_async(read)()


def _query():
    Runner.objects.count()
    return threading.get_ident()


def _on(thread: int, checks: list) -> int:
    return sum(1 for ident in checks if ident == thread)


async def test_it_checks_a_connection_at_most_once_a_second(checks, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(database_threads, "_clock", lambda: now[0])
    call = database_threads.hot_database_call(_query, thread_sensitive=True)
    async with own_database_thread(monkeypatch):
        for _ in range(5):
            thread = await call()
        # The first call on a connection may check it, no other.
        assert _on(thread, checks) <= 1, (checks, await _state())
        before = _on(thread, checks)
        now[0] += 1.5
        await call()
        await call()
        # A second later: checked once more.
        assert _on(thread, checks) == before + 1, (checks, await _state())


async def test_channels_alone_checks_on_every_call(checks, monkeypatch):
    """What the module spares: without it, every call begins with a check."""
    call = database_sync_to_async(_query, thread_sensitive=True)
    async with own_database_thread(monkeypatch):
        thread = await call()
        before = _on(thread, checks)
        for _ in range(3):
            assert await call() == thread
        assert _on(thread, checks) == before + 3, (checks, await _state())

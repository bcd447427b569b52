"""Database calls from the event loop on the hot paths (a runner socket's frames, the live
sockets' reads), with the connection's health check at most once a second.

Channels' ``database_sync_to_async`` treats every call as a request: it resets the
connection's health check before and after, so with ``CONN_HEALTH_CHECKS`` each call begins
with a ``SELECT 1`` round trip. On the live path that is a round trip more per doorbell and
per group commit, hundreds a second (issue 39). Here a connection that worked less than a
second ago is not checked again; one that failed since (``errors_occurred``) still is, by
Django, and a connection lost within that second fails its call, which the runner socket
tries once more on a fresh connection (``runner_socket.database_calls.collecting``) and the
live socket reads again at its next doorbell or heartbeat.
"""

from __future__ import annotations

import time

from channels.db import DatabaseSyncToAsync
from django.db import close_old_connections, connections

HEALTH_CHECK_SECONDS = 1.0
_clock = time.monotonic  # a test moves it, not the whole process's clock


def _skip_recent_health_check() -> None:
    now = _clock()
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or not connection.health_check_enabled:
            continue
        if connection.health_check_done:
            continue  # checked already (Django did, finding errors since the last call)
        if now - getattr(connection, "canopy_checked_at", float("-inf")) < HEALTH_CHECK_SECONDS:
            connection.health_check_done = True
        else:
            connection.canopy_checked_at = now  # the check Django makes at the first query


class HotDatabaseCall(DatabaseSyncToAsync):
    def thread_handler(self, loop, *args, **kwargs):
        # As DatabaseSyncToAsync.thread_handler, with the health check spared in between.
        close_old_connections()
        _skip_recent_health_check()
        try:
            return super(DatabaseSyncToAsync, self).thread_handler(loop, *args, **kwargs)
        finally:
            close_old_connections()


def hot_database_call(function, *, thread_sensitive: bool):
    """``function`` on a database thread, as ``database_sync_to_async`` runs it."""
    return HotDatabaseCall(function, thread_sensitive=thread_sensitive)

"""Service calls from the event loop: on a database thread, doorbells collected to ring
without a thread hop, a lost connection tried once more, and the commands a call queued for
its runner claimed on the same thread.

The runner socket (``consumer``) and the group commit of ``run.event`` frames
(``frame_groups``) both call the services this way.
"""

from __future__ import annotations

import contextlib
import logging

from django.db import InterfaceError, OperationalError
from django.db import connection as db_connection

from delegation import notify
from delegation.database_threads import hot_database_call
from delegation.errors import INTERNAL_ERROR, RpcError
from delegation.services import outbox
from delegation.services.locks import is_lost_connection

log = logging.getLogger(__name__)


def claim(conn) -> list:
    """This connection's unsent commands, claimed once more on a fresh database connection
    when a lost one cut the first try off; [] when even that fails (the next doorbell or the
    poll sends them: a claim never turns into an error for a call already answered)."""
    for attempt in (1, 2):
        try:
            return outbox.claim_commands(conn)
        except (OperationalError, InterfaceError) as exc:
            if not is_lost_connection(exc):
                break
            log.warning("database connection lost claiming commands (attempt %d)", attempt)
            with contextlib.suppress(Exception):
                db_connection.close()
        except Exception:
            break
    log.warning("could not claim commands for runner %s", conn.runner_pk, exc_info=True)
    return []


def queued_for(conn, bells: dict) -> bool:
    """Whether the call queued commands for this runner (its outbox doorbell is among the
    call's): run.event through a budget stop, child.start, a cancel, a steer, a release..."""
    ring = bells.get((notify.runner_group(conn.runner_pk), None))
    return ring is not None and ring.get("type") == "outbox.ring"


def collecting(function, *args, claim_for=None):
    # A refusal may follow a commit (a depth refusal stores its event), so its doorbells
    # are returned alongside the error rather than lost with it.
    #
    # Every runner method is idempotent (run.event by `from`, run.finish by state, child.*
    # by requestId or by state, an answer by its command), so work cut off by a lost
    # database connection is tried once more on a fresh one; if that fails too the runner
    # is told the failure is retryable (-32603, data.retryable) and the SDK sends it again.
    #
    # With ``claim_for`` (the caller's connection), the commands the call queued for that
    # runner are claimed on this same database thread, within the same lost-connection
    # retry, so the socket sends them right after its answer.
    collected: dict = {}
    for attempt in (1, 2):
        with notify.collect() as bells:
            try:
                result = function(*args)
                collected.update(bells)
                commands = []
                if claim_for is not None and queued_for(claim_for, collected):
                    commands = claim(claim_for)
                return result, None, collected, commands
            except RpcError as exc:
                collected.update(bells)
                return None, exc, collected, []
            except (OperationalError, InterfaceError) as exc:
                collected.update(bells)
                if not is_lost_connection(exc):
                    raise
                log.warning("database connection lost (attempt %d): %s", attempt, exc)
                with contextlib.suppress(Exception):
                    db_connection.close()
    error = RpcError(
        INTERNAL_ERROR,
        "database unavailable; the call changed nothing that a retry would repeat: retry it",
        data={"retryable": True},
    )
    return None, error, collected, []


def on_database(function):
    """``function`` on a database thread: any free one on PostgreSQL, the one shared thread
    on SQLite (a single writer).

    Not channels' default everywhere: its one thread per process is shared by every socket's
    outbox claims and polls and every sync view, so on PostgreSQL a cancel's flush waited in
    that queue for seconds under load (issue 20). Health-checked at most once a second
    (``database_threads``)."""
    return hot_database_call(function, thread_sensitive=db_connection.vendor != "postgresql")

"""The one lock order of every transaction, and the retry of the conflicts PostgreSQL breaks.

Lock order (every service takes the locks it needs in this order, never back up it):

1. the runner row, ``select_for_update(no_key=True)``: ``FOR NO KEY UPDATE`` serialises a runner's
   registrations, fences and child starts, yet never blocks the key-share lock a new
   command, run, session or lease row takes on its runner through its foreign key;
2. the lease row (``child.start`` with a ``leaseId``, release);
3. run rows (``lock_run``), ancestors before descendants (a parent before its child, a
   budget's run before its subtree);
4. budget rows, in run-pk order (``budgets.admit_child``);
5. rollup rows, in ascending pk order, last (``rollups``).

Command rows are only inserted, or locked one at a time after the runner row (answers,
claims), so they take no place of their own. Under this order a ``child.start`` (runner,
then its parent run) and a cancel or budget stop from another connection (runs, then a
``run.cancel`` command referencing the runner) cannot wait on each other.

PostgreSQL may still abort a transaction with a deadlock (40P01) or a serialization failure
(40001) that some other path provokes: ``retry_conflicts`` runs the whole transaction again,
so neither reaches a runner or an operator. It also runs it once more on a fresh connection
when the connection itself was lost (a terminated backend, a restarted server): every
operator action and runner method is idempotent by state or by requestId.
"""

from __future__ import annotations

import functools
import logging
import random
import time

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from delegation.models import Run
from delegation.selectors import RESULT_RELATED

log = logging.getLogger(__name__)

# 40P01 deadlock_detected, 40001 serialization_failure: the transaction changed nothing.
CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})
CONFLICT_ATTEMPTS = 5


def lock_run(pk: int) -> Run:
    # of=("self",): PostgreSQL cannot lock the nullable side of the outer joins.
    return Run.objects.select_for_update(of=("self",)).select_related(*RESULT_RELATED).get(pk=pk)


def is_conflict(exc: BaseException) -> bool:
    """A deadlock or serialization failure PostgreSQL aborted the transaction with."""
    return getattr(exc.__cause__, "sqlstate", None) in CONFLICT_SQLSTATES


# SQLSTATEs of a connection that is gone: class 08 (connection exception) and the server's
# own shutdowns (57P01 admin shutdown, as pg_terminate_backend sends; 57P02; 57P03).
GONE_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})


def is_lost_connection(exc: BaseException) -> bool:
    """Whether a database error means the connection itself is gone, as opposed to a query
    the database refused. SQLite has no connection to lose: its errors never count."""
    if connection.vendor != "postgresql":
        return False
    if isinstance(exc, InterfaceError):
        return True  # "connection already closed"
    if not isinstance(exc, OperationalError):
        return False
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    # No SQLSTATE: the client library lost the socket ("server closed the connection").
    return sqlstate is None or sqlstate.startswith("08") or sqlstate in GONE_SQLSTATES


def retry_conflicts(function):
    """Run ``function`` (which opens its own transaction) again on a deadlock or a
    serialization failure, with a short jittered pause; inside a caller's transaction it
    runs once, and the outermost retry repeats the whole of it."""

    @functools.wraps(function)
    def retried(*args, **kwargs):
        if transaction.get_connection().in_atomic_block:
            return function(*args, **kwargs)
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                return function(*args, **kwargs)
            except DatabaseError as exc:
                if is_lost_connection(exc) and attempt == 1:
                    log.warning("%s: database connection lost; retrying", function.__name__)
                    connection.close()  # the next query opens a fresh one
                    continue
                if not is_conflict(exc) or attempt == CONFLICT_ATTEMPTS:
                    raise
                sqlstate = exc.__cause__.sqlstate
                log.info("%s: %s, attempt %d; retrying", function.__name__, sqlstate, attempt)
                time.sleep(random.uniform(0.005, 0.02) * attempt)
        raise AssertionError("unreachable")  # the loop returns or raises

    return retried

"""The group commit of ``run.event`` frames across the runner sockets of one process.

A socket hands its ``run.event`` frames here (one, or several that were waiting behind each
other) and waits for their answers before it takes its next frame, so its own frames stay
in order. Meanwhile the frames other sockets hand in wait, and go together into the next
transaction: one lock statement, one ``COPY``, one commit and one round of doorbells for all
of them, each frame still answered on its own (``streams.append_event_frames_of``). Nothing
waits to fill a group: a frame that finds no commit in progress goes at once. The database
thread takes the next group itself while frames wait (``FrameGroups._drain``), for up to
DRAIN_SECONDS a call, so a steady stream costs no thread hop per group.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref

from django.conf import settings
from django.db import connection as db_connection

from delegation import notify
from delegation.errors import INTERNAL_ERROR, RpcError
from delegation.runner_socket import methods
from delegation.runner_socket.database_calls import claim, collecting, on_database, queued_for
from delegation.services.identity import Connection

log = logging.getLogger(__name__)

# How long one database call keeps committing groups while frames wait.
DRAIN_SECONDS = 0.01

_per_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def frame_groups() -> FrameGroups:
    """This event loop's (one a server process; the test suite runs a loop per test)."""
    loop = asyncio.get_running_loop()
    groups = _per_loop.get(loop)
    if groups is None:
        groups = _per_loop[loop] = FrameGroups()
    return groups


def _commit(calls: list[tuple[Connection, list]]) -> tuple[list, dict]:
    """On a database thread: every call's frames in one go, then the commands each call
    queued for its runner (a budget stop), claimed here as a lone call's are."""
    try:
        outcomes, bells = _store(calls)
    except Exception:
        if len(calls) == 1:
            raise
        # One socket's frames broke the shared transaction (none of it was kept): each
        # socket's frames again on their own, so only that socket hears of it.
        log.exception(
            "a group commit of %d sockets' frames failed; committing each alone", len(calls)
        )
        outcomes, bells = [], {}
        for conn, raw_frames in calls:
            try:
                [own], rung = _store([(conn, raw_frames)])
            except Exception:
                log.exception("run.event frames of runner %s failed", conn.runner_pk)
                own, rung = [RpcError(INTERNAL_ERROR, "internal error")] * len(raw_frames), {}
            outcomes.append(own)
            bells.update(rung)
    answers = []
    for (conn, _raw_frames), frame_outcomes in zip(calls, outcomes, strict=True):
        commands = claim(conn) if queued_for(conn, bells) else []
        answers.append((frame_outcomes, commands))
    return answers, bells


def _store(calls: list[tuple[Connection, list]]) -> tuple[list, dict]:
    outcomes, error, bells, _commands = collecting(methods.append_event_frames_of, calls)
    if error is not None:  # the database was lost twice: every frame may be sent again
        outcomes = [[error] * len(raw_frames) for _conn, raw_frames in calls]
    return outcomes, bells


def _commits_at_once() -> int:
    # Two on PostgreSQL, so a slow group (a budget stop cancelling a large subtree runs
    # before its frames are answered) never holds up every socket of the process; SQLite
    # has one writer.
    return 2 if db_connection.vendor == "postgresql" else 1


class FrameGroups:
    def __init__(self):
        self.waiting: list[tuple[Connection, list, asyncio.Future]] = []
        self.committing = 0  # touched on the loop only
        # The loop appends and the committing database thread takes, under this lock.
        self.lock = threading.Lock()

    async def append(self, conn: Connection, raw_frames: list) -> tuple[list, list]:
        """Each frame's answer or RpcError, in order, and the commands queued for the
        caller's runner."""
        future = asyncio.get_running_loop().create_future()
        with self.lock:
            self.waiting.append((conn, raw_frames, future))
        if self.committing < _commits_at_once():
            self.committing += 1
            asyncio.ensure_future(self._commit_waiting())
        return await future

    async def _commit_waiting(self):
        loop = asyncio.get_running_loop()
        try:
            # Checked on the loop, where frames are appended: none can slip in between the
            # last check and the release below.
            while self.waiting:
                try:
                    await on_database(self._drain)(loop)
                except Exception as exc:  # outside any group (a group's own is answered)
                    log.exception("the group commit of run.event frames failed")
                    with self.lock:
                        stranded, self.waiting = self.waiting, []
                    for _conn, _frames, future in stranded:  # every socket waiting hears it
                        if not future.done():
                            future.set_exception(exc)
        finally:
            self.committing -= 1

    def _drain(self, loop) -> None:
        """On the database thread: group after group while frames wait, each group's answers
        handed to the loop as soon as it is committed, so the next group starts without a
        thread hop there and back (issue 39: ingest from 4 runners 1.07x on SQLite, 1.12x on
        PostgreSQL). Back to the loop once nothing waits, or after DRAIN_SECONDS, so the
        thread's other calls (on SQLite, one thread serves them all) wait behind a few groups
        at most, not behind a steady stream."""
        deadline = time.monotonic() + DRAIN_SECONDS
        while True:
            with self.lock:
                if not self.waiting:
                    return
                batch = self._take()
            try:
                answers, bells = _commit([(c, f) for c, f, _ in batch])
                failure = None
            except Exception as exc:  # every socket waiting on this commit hears it
                answers, bells, failure = None, {}, exc
            asyncio.run_coroutine_threadsafe(_answer(batch, answers, bells, failure), loop)
            if time.monotonic() >= deadline:
                return  # at least one group a call, however short DRAIN_SECONDS is

    def _take(self) -> list:
        """The waiting calls, oldest first, up to RUN_EVENT_GROUP_MAX frames in all (a call
        is never split: its frames are one socket's, in order)."""
        batch, frames = [], 0
        limit = settings.RUN_EVENT_GROUP_MAX
        while self.waiting and (not batch or frames + len(self.waiting[0][1]) <= limit):
            entry = self.waiting.pop(0)
            batch.append(entry)
            frames += len(entry[1])
        return batch


async def _answer(batch: list, answers: list | None, bells: dict, failure: Exception | None):
    """On the loop: the group's doorbells, then each socket's answers (a doorbell that fails
    to ring is logged; the answers go out regardless, as what they answer is committed)."""
    if bells:
        try:
            await notify.ring_collected(bells)
        except Exception:
            log.exception("the doorbells of a group commit failed to ring")
    for index, (_conn, _frames, future) in enumerate(batch):
        if future.done():
            continue  # its socket went away meanwhile
        if answers is None:
            future.set_exception(failure)
        else:
            future.set_result(answers[index])

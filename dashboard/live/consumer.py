"""The live socket's consumer: subscriptions, doorbells, catch-up from the database, heartbeats
and back-pressure (the protocol is described in ``dashboard.live``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from dashboard.live.frames import (
    FrameError,
    Ping,
    SubscribeRoots,
    SubscribeRun,
    SubscribeTree,
    Unsubscribe,
    parse_client_frame,
)
from dashboard.live.gate import authorise, can_act, recheck
from delegation import metrics, notify, selectors
from delegation.protocol import (
    CLOSE_FORBIDDEN,
    CLOSE_TOO_MANY,
    CLOSE_UNAUTHORIZED,
    bearer_token,
)
from delegation.wire import dumps

log = logging.getLogger(__name__)

# Events per catch-up read: each may carry 4 x 32 KiB, so a page stays a few MB at most.
EVENT_PAGE = 100
DRAIN_POLL_SECONDS = 0.05
TREE_CHUNK = 1000
# Rows per database read of a tree (and per "treeCols" frame: about 1 MB for 5,000 rows).
TREE_READ_CHUNK = 5000
TREE_FIRST_CHUNK = 500
# Trees above this many runs get the whole-tree diff (seconds of work at 100k runs) once a
# minute; the heartbeats between read the runs changed since the last read.
BIG_TREE = 20_000
BIG_TREE_FULL_DIFF_SECONDS = 60.0
MAX_FRAME_CHARS = 256 * 1024
MAX_RUN_SUBSCRIPTIONS = 200
MAX_TREE_SUBSCRIPTIONS = 20
TREE_OVERLAP_SECONDS = 5.0
# Frames a backlogged socket still owes its client (pongs, errors), sent once it drains.
MAX_OWED_REPLIES = 32
# Subscribe/unsubscribe frames waiting for the worker; more is a client not waiting for answers.
MAX_PENDING_JOBS = 256

# Open live sockets per user in this process (LIVE_MAX_SOCKETS_PER_USER).
_sockets_per_user: dict[int, int] = {}

# --- Reads (sync, run in a thread) -----------------------------------------------------------


def _run_delta(run_pk: int, after: int, limit: int):
    run = selectors.get_run_by_pk(run_pk)
    if run is None:
        return None, []
    return selectors.run_state(run), selectors.live_events_after(run_pk, after, limit)


# Sockets of one process watching the same run from the same point share one database read:
# twenty watchers woken by one doorbell cost one query, not twenty. The key holds the highest
# sequence a doorbell has announced, so a read joined later was started after that commit.
_heads: dict[int, int] = {}
_inflight: dict[tuple, asyncio.Future] = {}
_read_delta = database_sync_to_async(_run_delta, thread_sensitive=False)


def _read_off_thread(function):
    return database_sync_to_async(function, thread_sensitive=False)


def _note_head(run_pk, sequence) -> None:
    if isinstance(run_pk, int) and isinstance(sequence, int):
        if sequence > _heads.get(run_pk, 0):
            _heads[run_pk] = sequence


async def shared_run_delta(run_pk: int, after: int, limit: int):
    key = (run_pk, after, limit, _heads.get(run_pk, 0))
    future = _inflight.get(key)
    if future is None or future.get_loop() is not asyncio.get_running_loop():
        future = asyncio.ensure_future(_read_delta(run_pk, after, limit))
        _inflight[key] = future
        future.add_done_callback(lambda _done, key=key: _inflight.pop(key, None))
    return await asyncio.shield(future)


# --- The consumer ----------------------------------------------------------------------------


@dataclass
class _RunSub:
    pk: int
    run_id: str
    root_pk: int
    sent: int
    state: tuple | None = None
    # Events that arrived with doorbells, in arrival order, not yet sent or discarded.
    carried: list = field(default_factory=list)


@dataclass
class _TreeSub:
    top_pk: int
    run_id: str
    root_pk: int
    whole: bool
    rows: dict[int, tuple] = field(default_factory=dict)  # pk -> fingerprint sent
    ready: bool = False
    read_at: float = 0.0  # when the rows were last read (epoch seconds)
    compact: bool = False  # the snapshot goes as column arrays ("treeCols" frames)
    ids: dict[int, str] = field(default_factory=dict)  # pk -> runId, to name parents
    full_at: float = field(default_factory=time.time)  # the last whole-tree diff


def _fingerprint(row: dict) -> tuple:
    return (
        row["status"],
        row["events"],
        row["refusedSpawns"],
        row["cancelRequested"],
        row["finishedAt"],
        row["activity"],
        tuple((lease["leaseId"], lease["expiresAt"]) for lease in row["leases"]),
        tuple(row["usage"].values()),
        repr(row["budget"]),
    )


def _run_fingerprint(state: dict) -> tuple:
    return (
        state["status"],
        state["lastSequence"],
        state["done"],
        state["cancelled"],
        state["error"],
        len(state["output"]),
        hash(state["output"]),
        state["cancelRequestedAt"],
        state["refusedSpawns"],
    )


class LiveConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        self.backlogged = False
        self.runs: dict[int, _RunSub] = {}
        self.trees: dict[int, _TreeSub] = {}
        self.roots: dict[int, str] = {}
        self.root_state: dict[int, tuple] = {}
        self.new_trees = False
        self.runners = False
        self.runners_state = None
        self.groups_held: dict[str, int] = {}
        self.dirty_runs: set[int] = set()
        self.dirty_tree_runs: dict[int, set[int]] = {}
        self.dirty_roots: set[int] = set()
        self.dirty_runners = False
        self.jobs: list = []
        self.wake = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.owed: list[dict] = []
        token = bearer_token(self.scope.get("headers", []))
        user, role = await database_sync_to_async(authorise)(self.scope.get("user"), token)
        await self.accept()
        if user is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        if role is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        limit = settings.LIVE_MAX_SOCKETS_PER_USER
        if _sockets_per_user.get(user.pk, 0) >= limit:
            await self.send(
                text_data=dumps(
                    {
                        "type": "error",
                        "code": "limit",
                        "field": "",
                        "message": f"too many live sockets: at most {limit} per user "
                        "(LIVE_MAX_SOCKETS_PER_USER); close one first",
                    }
                )
            )
            await self.close(code=CLOSE_TOO_MANY)
            return
        _sockets_per_user[user.pk] = _sockets_per_user.get(user.pk, 0) + 1
        self.counted_user = user.pk
        # What the heartbeat re-checks: the credential this socket was opened with.
        session = self.scope.get("session")
        self.session_key = None if token else getattr(session, "session_key", None)
        self.token = token
        self.user = user
        self.counted = True
        metrics.LIVE_SOCKETS.inc()
        self.heartbeat_seconds = float(settings.LIVE_HEARTBEAT_SECONDS)
        await self._send(
            {
                "type": "hello",
                "heartbeatSeconds": self.heartbeat_seconds,
                "serverTime": int(time.time() * 1000),
                "user": user.get_username(),
                "role": role,
                "canAct": await database_sync_to_async(can_act)(user),
            }
        )
        self.tasks.append(asyncio.ensure_future(self._work()))
        self.tasks.append(asyncio.ensure_future(self._beat()))

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            # However the consumer ends (a close, a crash), its worker and heartbeat end too:
            # a leftover heartbeat would keep querying for a socket nobody holds.
            await self._shut_down()

    async def dispatch(self, message):
        # A doorbell type this socket does not know (a newer engine) must not close it.
        if getattr(self, get_handler_name(message), None) is None:
            return
        try:
            await super().dispatch(message)
        except (StopConsumer, asyncio.CancelledError):
            raise
        except Exception:
            # The frame boundary: an unexpected error answers an error frame, the socket lives.
            log.exception("live socket: %s failed", message.get("type"))
            if message.get("type") == "websocket.receive":
                await self._reply(
                    {
                        "type": "error",
                        "code": "internal",
                        "field": "",
                        "message": "internal error; the frame was not handled",
                    }
                )
            elif message.get("type") == "websocket.connect":
                await self.close(code=1011)

    async def disconnect(self, code):
        await self._shut_down()

    async def _shut_down(self):
        if getattr(self, "_shut", False):
            return
        self._shut = True
        if getattr(self, "counted", False):
            self.counted = False
            metrics.LIVE_SOCKETS.dec()
        for task in getattr(self, "tasks", []):
            task.cancel()
        counted = getattr(self, "counted_user", None)
        if counted is not None:
            left = _sockets_per_user.get(counted, 1) - 1
            if left > 0:
                _sockets_per_user[counted] = left
            else:
                _sockets_per_user.pop(counted, None)
        for group in list(getattr(self, "groups_held", {})):
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(group, self.channel_name)

    # --- frames in -------------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None):
        if not hasattr(self, "user"):
            return
        if text_data is None:
            await self._reply_error("", "frame: binary frames are refused")
            return
        if len(text_data) > 64 * 1024:
            await self._reply_error("", "frame: too large (max 65536 characters)")
            return
        try:
            frame = parse_client_frame(text_data)
        except FrameError as exc:
            await self._reply_error(exc.field, exc.message, exc.code)
            return
        if isinstance(frame, Ping):
            await self._reply({"type": "pong"})
        elif len(self.jobs) >= MAX_PENDING_JOBS:
            await self._reply_error(
                "",
                f"frame: {MAX_PENDING_JOBS} subscriptions are still pending; wait for them",
                "limit",
            )
        elif isinstance(frame, Unsubscribe):
            self._schedule(lambda: self._unsubscribe(frame))
        else:
            self._schedule(lambda: self._subscribe(frame))

    async def _reply(self, frame: dict):
        """Answer a client frame now, or once the client drains its backlog; never raise."""
        if not self.owed and not self.backlogged:
            try:
                await self._send(frame)
                return
            except _Backlogged:
                pass
        # Bounded: a client that sends while not reading cannot grow this without end.
        if len(self.owed) < MAX_OWED_REPLIES:
            self.owed.append(frame)
        if self._flush_owed not in self.jobs:
            self._schedule(self._flush_owed)

    async def _flush_owed(self):
        """Send owed replies in order; a still-backlogged socket raises and keeps the rest."""
        while self.owed:
            await self._send(self.owed[0])
            self.owed.pop(0)

    async def _reply_error(self, field_name: str, message: str, code: str = "invalid"):
        await self._reply({"type": "error", "code": code, "field": field_name, "message": message})

    def _schedule(self, job):
        self.jobs.append(job)
        self.wake.set()

    async def _subscribe(self, frame):
        if isinstance(frame, SubscribeRun):
            await self._subscribe_run(frame)
        elif isinstance(frame, SubscribeTree):
            await self._subscribe_tree(frame)
        elif isinstance(frame, SubscribeRoots):
            await self._subscribe_roots(frame)
        else:
            self.runners = True
            self.runners_state = None
            await self._hold(notify.RUNNERS_GROUP)
            await self._send({"type": "subscribed", "runners": True})
            await self._catch_up_runners()

    async def _subscribe_run(self, frame: SubscribeRun):
        run = await database_sync_to_async(selectors.get_run)(frame.run_id)
        if run is None:
            await self._error("runId", f"runId: no run {frame.run_id!r}", "not_found")
            return
        if run.pk not in self.runs and len(self.runs) >= MAX_RUN_SUBSCRIPTIONS:
            await self._error("runId", f"runId: at most {MAX_RUN_SUBSCRIPTIONS} runs", "limit")
            return
        old = self.runs.get(run.pk)
        self.runs[run.pk] = _RunSub(run.pk, run.run_id, run.root_id or run.pk, frame.after)
        if old is None:
            await self._hold(notify.run_group(run.pk))
        await self._send({"type": "subscribed", "runId": run.run_id, "after": frame.after})
        await self._catch_up_run(self.runs[run.pk])

    async def _subscribe_tree(self, frame: SubscribeTree):
        run = await database_sync_to_async(selectors.get_run)(frame.tree_id)
        if run is None:
            await self._error("treeId", f"treeId: no run {frame.tree_id!r}", "not_found")
            return
        if run.pk not in self.trees and len(self.trees) >= MAX_TREE_SUBSCRIPTIONS:
            await self._error("treeId", f"treeId: at most {MAX_TREE_SUBSCRIPTIONS} trees", "limit")
            return
        root_pk = run.root_id or run.pk
        old = self.trees.get(run.pk)
        sub = _TreeSub(run.pk, run.run_id, root_pk, whole=run.root_id is None)
        self.trees[run.pk] = sub
        if old is None:
            await self._hold(notify.tree_group(root_pk))
        await self._send({"type": "subscribed", "treeId": run.run_id})
        sub.read_at = time.time()
        sub.compact = frame.compact
        sub.rows = {}
        sub.ids = {}
        if run.parent_id:
            sub.ids[run.parent_id] = await database_sync_to_async(selectors.run_id_of)(
                run.parent_id
            )
        await self._stream_tree(sub, first=True)
        sub.ready = True

    async def _stream_tree(self, sub: _TreeSub, first: bool):
        """Read the subtree a chunk at a time and either send it whole (the snapshot) or send
        the rows whose fingerprint changed (the full diff on a heartbeat)."""
        # Off the shared sync thread: a 100k-run snapshot is seconds of reads, and other
        # sockets' handshakes and the pages' views must not queue behind it.
        leases = await _read_off_thread(selectors.tree_leases)(sub.root_pk)
        after, keep, changed, sent_any = None, None, [], False
        # Reading, fingerprinting and encoding a chunk all happen in that thread too: done on
        # the event loop they held up every other socket of the process for seconds.
        read = _read_off_thread(_tree_chunk_prepared)
        while True:
            # A small first chunk puts the top of the tree on screen sooner.
            size = TREE_FIRST_CHUNK if first and after is None else TREE_READ_CHUNK
            chunk = await read(sub, after, size, keep, leases, first)
            if chunk is None:
                break
            after, keep, fingerprints, texts, rows = chunk
            if first:
                sub.rows.update(fingerprints)
                for text in texts:
                    await self._send_patiently(text)
                sent_any = True
            else:
                for row in rows:
                    if sub.rows.get(row["pk"]) != fingerprints[row["pk"]]:
                        sub.rows[row["pk"]] = fingerprints[row["pk"]]
                        changed.append(row)
            if after is None:
                break
        if first and not sent_any:
            await self._send({"type": "tree", "treeId": sub.run_id, "runs": [], "more": False})
        for start in range(0, len(changed), TREE_CHUNK):
            await self._send(
                {"type": "rows", "treeId": sub.run_id, "runs": changed[start : start + TREE_CHUNK]}
            )

    async def _subscribe_roots(self, frame: SubscribeRoots):
        found = await database_sync_to_async(selectors.root_pks_by_run_id)(frame.roots)
        limit = settings.LIVE_MAX_ROOT_SUBSCRIPTIONS
        if len(set(self.roots) | set(found)) > limit:
            await self._error(
                "roots",
                f"roots: at most {limit} roots per socket (LIVE_MAX_ROOT_SUBSCRIPTIONS); "
                f"{len(self.roots)} already subscribed, unsubscribe some first",
                "limit",
            )
            return
        for pk in found:
            if pk not in self.roots:
                await self._hold(notify.tree_group(pk))
        self.roots.update(found)
        if frame.new_trees and not self.new_trees:
            await self._hold(notify.TREES_GROUP)
        self.new_trees = self.new_trees or frame.new_trees
        await self._send({"type": "subscribed", "roots": list(found.values())})
        for pk in found:
            self.root_state.pop(pk, None)
        await self._catch_up_roots(set(found))

    async def _unsubscribe(self, frame: Unsubscribe):
        if frame.run_id is not None:
            for pk, sub in list(self.runs.items()):
                if sub.run_id == frame.run_id:
                    del self.runs[pk]
                    await self._release(notify.run_group(pk))
        if frame.tree_id is not None:
            for pk, sub in list(self.trees.items()):
                if sub.run_id == frame.tree_id:
                    del self.trees[pk]
                    await self._release(notify.tree_group(sub.root_pk))
        if frame.roots is not None:
            for pk, run_id in list(self.roots.items()):
                if run_id in frame.roots:
                    del self.roots[pk]
                    self.root_state.pop(pk, None)
                    await self._release(notify.tree_group(pk))
        if frame.runners:
            self.runners = False
            await self._release(notify.RUNNERS_GROUP)

    async def _hold(self, group: str):
        count = self.groups_held.get(group, 0)
        self.groups_held[group] = count + 1
        if count == 0:
            await self.channel_layer.group_add(group, self.channel_name)

    async def _release(self, group: str):
        count = self.groups_held.get(group, 0) - 1
        if count <= 0:
            self.groups_held.pop(group, None)
            await self.channel_layer.group_discard(group, self.channel_name)
        else:
            self.groups_held[group] = count

    # --- doorbells ---------------------------------------------------------------------------

    async def run_changed(self, message):
        run_pk, root_pk = message.get("run"), message.get("root")
        _note_head(run_pk, message.get("sequence"))
        if run_pk in self.runs:
            sub = self.runs[run_pk]
            if message.get("events") and sub.state and message.get("status") == sub.state[0]:
                sub.carried.append(message["events"])
            else:
                sub.carried.append(None)  # something a doorbell cannot carry: read it
            self.dirty_runs.add(run_pk)
        if any(sub.root_pk == root_pk for sub in self.trees.values()):
            self.dirty_tree_runs.setdefault(root_pk, set()).add(run_pk)
        if root_pk in self.roots:
            self.dirty_roots.add(root_pk)
        if self.new_trees and message.get("new") and run_pk == root_pk:
            self._schedule(lambda: self._new_tree(run_pk))
        self.wake.set()

    async def runner_changed(self, message):
        if self.runners:
            self.dirty_runners = True
            self.wake.set()

    # --- the worker: every read and send happens here, one at a time ---------------------------

    async def _work(self):
        while True:
            await self.wake.wait()
            self.wake.clear()
            try:
                await self._drain()
            except asyncio.CancelledError:
                raise
            except _Closed:
                return
            except _Backlogged:
                await self._resume_when_drained()
            except Exception:
                log.exception("live catch-up failed; retrying on the next doorbell or heartbeat")

    async def _drain(self):
        while self.jobs or self.dirty_runs or self.dirty_tree_runs or self.dirty_roots:
            while self.jobs:
                job = self.jobs.pop(0)
                await job()
            dirty_runs, self.dirty_runs = self.dirty_runs, set()
            for pk in sorted(dirty_runs):
                if pk in self.runs and not await self._push_carried(self.runs[pk]):
                    await self._catch_up_run(self.runs[pk])
            dirty_trees, self.dirty_tree_runs = self.dirty_tree_runs, {}
            for root_pk, run_pks in dirty_trees.items():
                for sub in list(self.trees.values()):
                    if sub.root_pk == root_pk and sub.ready:
                        await self._catch_up_tree(sub, run_pks)
            dirty_roots, self.dirty_roots = self.dirty_roots, set()
            if dirty_roots:
                await self._catch_up_roots(dirty_roots)
        if self.dirty_runners:
            self.dirty_runners = False
            await self._catch_up_runners()

    async def _beat(self):
        """Catch every subscription up from the database, then tell the client the heads."""
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            self.jobs.append(self._sweep_and_beat)
            self.wake.set()

    async def _sweep_and_beat(self):
        # Authority is re-checked on every heartbeat: a logout, an expired session, a
        # deactivated user, a removed role or a revoked or expired token ends the stream.
        code = await database_sync_to_async(recheck)(self.user.pk, self.session_key, self.token)
        if code is not None:
            log.info("live socket of user %s closed with %s: authority ended", self.user.pk, code)
            for task in self.tasks:
                if task is not asyncio.current_task():
                    task.cancel()
            self.jobs.clear()
            await self.close(code=code)
            raise _Closed
        # Re-join every group: a Redis restart forgets memberships, and doorbells with them.
        for group in list(self.groups_held):
            await self.channel_layer.group_add(group, self.channel_name)
        await self._catch_up_all()
        await self._send(
            {
                "type": "heartbeat",
                "at": int(time.time() * 1000),
                "runs": {sub.run_id: sub.sent for sub in self.runs.values()},
                "trees": {sub.run_id: len(sub.rows) for sub in self.trees.values()},
            }
        )

    async def _catch_up_all(self):
        for sub in list(self.runs.values()):
            await self._catch_up_run(sub)
        for sub in list(self.trees.values()):
            if sub.ready:
                if (
                    len(sub.rows) <= BIG_TREE
                    or time.time() - sub.full_at > BIG_TREE_FULL_DIFF_SECONDS
                ):
                    sub.full_at = time.time()
                    await self._catch_up_tree(sub, None)
                else:
                    # A big tree is diffed whole less often: between full diffs, the runs
                    # changed since the last read (by updated_at) are enough.
                    await self._catch_up_tree(sub, set())
        if self.roots:
            await self._catch_up_roots(set(self.roots))
        if self.runners:
            await self._catch_up_runners()

    async def _resume_when_drained(self):
        """A paused socket resumes as soon as its client has taken half of the backlog."""
        while True:
            await asyncio.sleep(DRAIN_POLL_SECONDS)
            backlog = _unsent_bytes(self.base_send)
            if backlog is None or backlog <= settings.LIVE_MAX_BACKLOG_BYTES // 2:
                break
        self.jobs.insert(0, self._flush_owed)
        self.jobs.append(self._catch_up_all)
        self.wake.set()

    async def _push_carried(self, sub: _RunSub) -> bool:
        """Send events that came with doorbells if they continue exactly where this socket
        is; False when anything is missing or unknown, and the database must be read."""
        carried, sub.carried = sub.carried, []
        if not carried:
            return False
        for events in carried:
            if events is None:
                return False
            if events[-1]["sequence"] <= sub.sent:
                continue  # already sent by an earlier read
            if events[0]["sequence"] != sub.sent + 1:
                return False  # a gap: a doorbell was lost or came out of order
            for batch in _batches(events):
                await self._send({"type": "events", "runId": sub.run_id, "events": batch})
                sub.sent = batch[-1]["sequence"]
                metrics.pushed(batch[-1].get("createdAt"))
        return True

    async def _catch_up_run(self, sub: _RunSub):
        while True:
            state, events = await shared_run_delta(sub.pk, sub.sent, EVENT_PAGE)
            if state is None:
                return
            fresh = []
            for event in events:
                # Sequences are allocated under the run's lock, so what is visible is a prefix;
                # stopping at a hole anyway means a frame can never skip a sequence.
                if event["sequence"] != sub.sent + len(fresh) + 1:
                    break
                fresh.append(event)
            for batch in _batches(fresh):
                await self._send({"type": "events", "runId": sub.run_id, "events": batch})
                sub.sent = batch[-1]["sequence"]
                metrics.pushed(batch[-1].get("createdAt"))
            fingerprint = _run_fingerprint(state)
            if fingerprint != sub.state:
                sub.state = fingerprint
                await self._send({"type": "run", "run": state})
            if len(events) < EVENT_PAGE or len(fresh) < len(events):
                return

    async def _catch_up_tree(self, sub: _TreeSub, run_pks):
        if run_pks is None:
            sub.read_at = time.time()
            await self._stream_tree(sub, first=False)
            return
        since = None
        if run_pks is not None:
            since = datetime.fromtimestamp(sub.read_at - TREE_OVERLAP_SECONDS, tz=UTC)
        sub.read_at = time.time()
        rows = await database_sync_to_async(selectors.tree_rows_changed)(sub.top_pk, run_pks, since)
        rows.sort(key=lambda row: (row["depth"], row["pk"]))
        changed = []
        for row in rows:
            if not sub.whole and row["pk"] not in sub.rows:
                if row["parentPk"] not in sub.rows and row["pk"] != sub.top_pk:
                    continue
            fingerprint = _fingerprint(row)
            if sub.rows.get(row["pk"]) != fingerprint:
                sub.rows[row["pk"]] = fingerprint
                sub.ids[row["pk"]] = row["runId"]
                changed.append(row)
        for start in range(0, len(changed), TREE_CHUNK):
            await self._send(
                {"type": "rows", "treeId": sub.run_id, "runs": changed[start : start + TREE_CHUNK]}
            )

    async def _catch_up_roots(self, root_pks):
        wanted = [pk for pk in root_pks if pk in self.roots]
        if not wanted:
            return
        summaries = await database_sync_to_async(selectors.root_summaries)(wanted)
        for pk, summary in summaries.items():
            state = (
                summary["status"],
                summary["runs"],
                summary["maxDepth"],
                tuple(sorted(summary["counts"].items())),
                summary["tokens"],
                summary["costUsd"],
                summary["budgetStopped"],
            )
            if self.root_state.get(pk) == state or pk not in self.roots:
                continue
            self.root_state[pk] = state
            await self._send({"type": "summary", "treeId": self.roots[pk], **summary})

    async def _catch_up_runners(self):
        if not self.runners:
            return
        rows = await database_sync_to_async(selectors.runner_states)()
        if rows != self.runners_state:
            self.runners_state = rows
            await self._send({"type": "runners", "runners": rows})

    async def _new_tree(self, root_pk: int):
        run_id = await database_sync_to_async(selectors.run_id_of)(root_pk)
        if run_id:
            await self._send({"type": "newTree", "treeId": run_id})

    # --- frames out --------------------------------------------------------------------------

    async def _send(self, frame: dict):
        backlog = _unsent_bytes(self.base_send)
        if backlog is not None and backlog > settings.LIVE_MAX_BACKLOG_BYTES:
            # Nothing pushes back through ASGI: without this, every frame for a client that
            # stopped reading would pile up in this process. Sending pauses instead (the
            # position of each subscription stays where it was) and resumes from the
            # database on a heartbeat once the client has drained its backlog.
            if not self.backlogged:
                log.info("live client %s paused: %d bytes unsent", self.channel_name, backlog)
                self.backlogged = True
            raise _Backlogged
        if self.backlogged:
            self.backlogged = False
            self._forget_what_was_sent()
        await self.send(text_data=frame if isinstance(frame, str) else dumps(frame))

    async def _send_patiently(self, frame):
        """Send a frame of a tree snapshot once the client has taken half of its backlog.

        A snapshot is bounded (it ends), so it waits for a slow client rather than pausing
        like the live stream: a paused snapshot would be abandoned half-sent, and the client
        would hold half a tree until it resubscribed.
        """
        while True:
            backlog = _unsent_bytes(self.base_send)
            if backlog is None or backlog <= settings.LIVE_MAX_BACKLOG_BYTES // 2:
                break
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        await self._send(frame)

    def _forget_what_was_sent(self):
        """After a pause, resend state snapshots: some were dropped mid-way."""
        for sub in self.runs.values():
            sub.state = None
            sub.carried = []
        for sub in self.trees.values():
            sub.rows = dict.fromkeys(sub.rows)  # keep which rows it has; resend them all
        self.root_state = {}
        self.runners_state = None

    async def _error(self, field_name: str, message: str, code: str = "invalid"):
        await self._send({"type": "error", "code": code, "field": field_name, "message": message})


def _tree_chunk_prepared(sub: _TreeSub, after, size: int, keep, leases: dict, first: bool):
    """One chunk of a tree read, fingerprinted and (for a snapshot) encoded, off the loop."""
    columns, after, keep = selectors.tree_chunk(sub.top_pk, after, size, keep)
    if columns is None:
        return None
    rows = selectors.column_rows(columns, leases, sub.ids)
    fingerprints = {row["pk"]: _fingerprint(row) for row in rows}
    texts = []
    if first:
        more = after is not None
        if sub.compact:
            frame = {"type": "treeCols", "treeId": sub.run_id, "columns": columns}
            frame["leases"] = {str(pk): leases[pk] for pk in columns["pk"] if pk in leases}
            frame["more"] = more
            texts.append(dumps(frame))
        else:
            for start in range(0, max(len(rows), 1), TREE_CHUNK):
                frame = {
                    "type": "tree",
                    "treeId": sub.run_id,
                    "runs": rows[start : start + TREE_CHUNK],
                    "more": more or start + TREE_CHUNK < len(rows),
                }
                texts.append(dumps(frame))
    return after, keep, fingerprints, texts, rows


def _batches(events: list[dict]):
    """Split events into frames of at most about MAX_FRAME_CHARS characters, in order."""
    batch, size = [], 0
    for event in events:
        cost = len(dumps(event))
        if batch and size + cost > MAX_FRAME_CHARS:
            yield batch
            batch, size = [], 0
        batch.append(event)
        size += cost
    if batch:
        yield batch


class _Closed(Exception):
    """The socket was closed by the server; the worker stops."""


class _Backlogged(Exception):
    """The client has not taken what was already sent; send nothing more for now."""


def _unsent_bytes(send) -> int | None:
    """Bytes written to this socket that the client has not taken yet, where daphne lets us
    see it: its ASGI ``send`` is ``partial(handle_reply, protocol)`` over a Twisted
    transport. None under any other server (the test communicator), where no check is made.
    """
    protocol = send.args[0] if isinstance(send, functools.partial) and send.args else None
    transport = getattr(protocol, "transport", None)
    if transport is None or not hasattr(transport, "dataBuffer"):
        return None
    return (
        len(transport.dataBuffer)
        - getattr(transport, "offset", 0)
        + getattr(transport, "_tempDataLen", 0)
    )

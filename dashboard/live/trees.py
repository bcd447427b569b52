"""Tree subscriptions: ``{"type": "subscribe", "treeId": R}``.

The subtree under run R as a snapshot in chunks (``tree`` frames, or ``treeCols`` column
arrays with ``compact``), then a ``rows`` frame for each run that appears or changes. Rows are
fingerprinted, so only what changed is sent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from channels.db import database_sync_to_async

from dashboard.live.caps import MAX_TREE_SUBSCRIPTIONS
from dashboard.live.frames import SubscribeTree, Unsubscribe
from dashboard.live.read_cache import read_off_thread
from delegation import notify, selectors
from delegation.selectors.approvals import pending_in_tree
from delegation.wire import dumps

TREE_CHUNK = 1000
# Rows per database read of a tree (and per "treeCols" frame: about 1 MB for 5,000 rows).
TREE_READ_CHUNK = 5000
TREE_FIRST_CHUNK = 500
# Trees above this many runs get the whole-tree diff (seconds of work at 100k runs) once a
# minute; the heartbeats between read the runs changed since the last read.
BIG_TREE = 20_000
BIG_TREE_FULL_DIFF_SECONDS = 60.0
TREE_OVERLAP_SECONDS = 5.0


@dataclass
class TreeSub:
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
        row.get("conclusionStatus"),
        row.get("pendingApprovals"),
        row.get("subPendingApprovals"),
        tuple((lease["leaseId"], lease["expiresAt"]) for lease in row["leases"]),
        tuple(row["usage"].values()),
        repr(row["budget"]),
    )


def _tree_chunk_prepared(sub: TreeSub, after, size: int, keep, side: tuple, first: bool):
    """One chunk of a tree read, fingerprinted and (for a snapshot) encoded, off the loop."""
    leases, pending = side
    columns, after, keep = selectors.tree_chunk(sub.top_pk, after, size, keep)
    if columns is None:
        return None
    rows = selectors.column_rows(columns, leases, sub.ids, pending)
    fingerprints = {row["pk"]: _fingerprint(row) for row in rows}
    texts = []
    if first:
        more = after is not None
        if sub.compact:
            frame = {"type": "treeCols", "treeId": sub.run_id, "columns": columns}
            frame["leases"] = {str(pk): leases[pk] for pk in columns["pk"] if pk in leases}
            # Pending approvals per run, [own, subtree] (few: only the runs that have any).
            frame["approvals"] = {str(pk): pending[pk] for pk in columns["pk"] if pk in pending}
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


class TreeSubscriptions:
    """The subtrees one socket follows, keyed by the top run's pk, and the rung roots."""

    def __init__(self, connection):
        self.connection = connection
        self.subs: dict[int, TreeSub] = {}
        self.dirty: dict[int, set[int]] = {}  # root pk -> run pks a doorbell named

    async def subscribe(self, frame: SubscribeTree):
        conn = self.connection
        run = await database_sync_to_async(selectors.get_run)(frame.tree_id)
        if run is None:
            await conn.error("treeId", f"treeId: no run {frame.tree_id!r}", "not_found")
            return
        if run.pk not in self.subs and len(self.subs) >= MAX_TREE_SUBSCRIPTIONS:
            await conn.error("treeId", f"treeId: at most {MAX_TREE_SUBSCRIPTIONS} trees", "limit")
            return
        root_pk = run.root_id or run.pk
        old = self.subs.get(run.pk)
        sub = TreeSub(run.pk, run.run_id, root_pk, whole=run.root_id is None)
        self.subs[run.pk] = sub
        if old is None:
            await conn.hold(notify.tree_group(root_pk))
        await conn.send({"type": "subscribed", "treeId": run.run_id})
        sub.read_at = time.time()
        sub.compact = frame.compact
        sub.rows = {}
        sub.ids = {}
        if run.parent_id:
            sub.ids[run.parent_id] = await database_sync_to_async(selectors.run_id_of)(
                run.parent_id
            )
        await self._stream(sub, first=True)
        sub.ready = True

    async def unsubscribe(self, frame: Unsubscribe):
        if frame.tree_id is None:
            return
        for pk, sub in list(self.subs.items()):
            if sub.run_id == frame.tree_id:
                del self.subs[pk]
                await self.connection.release(notify.tree_group(sub.root_pk))

    def ring(self, message: dict) -> None:
        run_pk, root_pk = message.get("run"), message.get("root")
        if any(sub.root_pk == root_pk for sub in self.subs.values()):
            self.dirty.setdefault(root_pk, set()).add(run_pk)

    async def catch_up_dirty(self):
        dirty, self.dirty = self.dirty, {}
        for root_pk, run_pks in dirty.items():
            for sub in list(self.subs.values()):
                if sub.root_pk == root_pk and sub.ready:
                    await self._catch_up(sub, run_pks)

    async def catch_up_all(self):
        for sub in list(self.subs.values()):
            if sub.ready:
                if (
                    len(sub.rows) <= BIG_TREE
                    or time.time() - sub.full_at > BIG_TREE_FULL_DIFF_SECONDS
                ):
                    sub.full_at = time.time()
                    await self._catch_up(sub, None)
                else:
                    # A big tree is diffed whole less often: between full diffs, the runs
                    # changed since the last read (by updated_at) are enough.
                    await self._catch_up(sub, set())

    def positions(self) -> dict[str, int]:
        """The heartbeat's ``trees``: how many rows of each tree were sent."""
        return {sub.run_id: len(sub.rows) for sub in self.subs.values()}

    def forget_sent(self):
        for sub in self.subs.values():
            sub.rows = dict.fromkeys(sub.rows)  # keep which rows it has; resend them all

    async def _send_rows(self, sub: TreeSub, changed: list[dict]):
        for start in range(0, len(changed), TREE_CHUNK):
            await self.connection.send(
                {"type": "rows", "treeId": sub.run_id, "runs": changed[start : start + TREE_CHUNK]}
            )

    async def _stream(self, sub: TreeSub, first: bool):
        """Read the subtree a chunk at a time and either send it whole (the snapshot) or send
        the rows whose fingerprint changed (the full diff on a heartbeat)."""
        conn = self.connection
        # Off the shared sync thread: a 100k-run snapshot is seconds of reads, and other
        # sockets' handshakes and the pages' views must not queue behind it.
        leases = await read_off_thread(selectors.tree_leases)(sub.root_pk)
        # One grouped read per snapshot or full diff, not one per row.
        pending = await read_off_thread(pending_in_tree)(sub.root_pk)
        after, keep, changed, sent_any = None, None, [], False
        # Reading, fingerprinting and encoding a chunk all happen in that thread too: done on
        # the event loop they held up every other socket of the process for seconds.
        read = read_off_thread(_tree_chunk_prepared)
        while True:
            # A small first chunk puts the top of the tree on screen sooner.
            size = TREE_FIRST_CHUNK if first and after is None else TREE_READ_CHUNK
            chunk = await read(sub, after, size, keep, (leases, pending), first)
            if chunk is None:
                break
            after, keep, fingerprints, texts, rows = chunk
            if first:
                sub.rows.update(fingerprints)
                for text in texts:
                    await conn.send_patiently(text)
                sent_any = True
            else:
                for row in rows:
                    if sub.rows.get(row["pk"]) != fingerprints[row["pk"]]:
                        sub.rows[row["pk"]] = fingerprints[row["pk"]]
                        changed.append(row)
            if after is None:
                break
        if first and not sent_any:
            await conn.send({"type": "tree", "treeId": sub.run_id, "runs": [], "more": False})
        await self._send_rows(sub, changed)

    async def _catch_up(self, sub: TreeSub, run_pks):
        """The rows of ``run_pks`` that changed (and, with an empty set, of every run updated
        since the last read); ``None`` diffs the whole tree."""
        if run_pks is None:
            sub.read_at = time.time()
            await self._stream(sub, first=False)
            return
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
        await self._send_rows(sub, changed)

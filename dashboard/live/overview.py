"""The trees overview: ``{"type": "subscribe", "roots": [R, ...], "newTrees": true}``.

A ``summary`` frame per root (counts by status, deepest depth, number of runs, usage) now and
whenever the tree changes, and with ``newTrees`` a ``newTree`` frame whenever a top-level run
opens. At most ``LIVE_MAX_ROOT_SUBSCRIPTIONS`` roots per socket, across frames.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.conf import settings

from dashboard.live.frames import SubscribeRoots, Unsubscribe
from delegation import notify, selectors


class RootSubscriptions:
    """The roots one socket follows (pk -> runId), their last summary, and ``newTrees``."""

    def __init__(self, connection):
        self.connection = connection
        self.roots: dict[int, str] = {}
        self.state: dict[int, tuple] = {}
        self.new_trees = False
        self.dirty: set[int] = set()

    async def subscribe(self, frame: SubscribeRoots):
        conn = self.connection
        found = await database_sync_to_async(selectors.root_pks_by_run_id)(frame.roots)
        limit = settings.LIVE_MAX_ROOT_SUBSCRIPTIONS
        if len(set(self.roots) | set(found)) > limit:
            await conn.error(
                "roots",
                f"roots: at most {limit} roots per socket (LIVE_MAX_ROOT_SUBSCRIPTIONS); "
                f"{len(self.roots)} already subscribed, unsubscribe some first",
                "limit",
            )
            return
        for pk in found:
            if pk not in self.roots:
                await conn.hold(notify.tree_group(pk))
        self.roots.update(found)
        if frame.new_trees and not self.new_trees:
            await conn.hold(notify.TREES_GROUP)
        self.new_trees = self.new_trees or frame.new_trees
        await conn.send({"type": "subscribed", "roots": list(found.values())})
        for pk in found:
            self.state.pop(pk, None)
        await self._catch_up(set(found))

    async def unsubscribe(self, frame: Unsubscribe):
        if frame.roots is None:
            return
        for pk, run_id in list(self.roots.items()):
            if run_id in frame.roots:
                del self.roots[pk]
                self.state.pop(pk, None)
                await self.connection.release(notify.tree_group(pk))

    def ring(self, message: dict) -> None:
        run_pk, root_pk = message.get("run"), message.get("root")
        if root_pk in self.roots:
            self.dirty.add(root_pk)
        if self.new_trees and message.get("new") and run_pk == root_pk:
            self.connection.schedule(lambda: self._new_tree(run_pk))

    async def catch_up_dirty(self):
        dirty, self.dirty = self.dirty, set()
        if dirty:
            await self._catch_up(dirty)

    async def catch_up_all(self):
        if self.roots:
            await self._catch_up(set(self.roots))

    def forget_sent(self):
        self.state = {}

    async def _catch_up(self, root_pks):
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
            if self.state.get(pk) == state or pk not in self.roots:
                continue
            self.state[pk] = state
            await self.connection.send({"type": "summary", "treeId": self.roots[pk], **summary})

    async def _new_tree(self, root_pk: int):
        run_id = await database_sync_to_async(selectors.run_id_of)(root_pk)
        if run_id:
            await self.connection.send({"type": "newTree", "treeId": run_id})

"""``client.await_children``: the ``await_children`` join of SPEC §9 for runners, built on
``child.read`` (the runner protocol gains no method for it).

The runner protocol pushes nothing about children, so the join reads each unfinished child
with ``child.read`` (past every event: only its state) and backs off between rounds, from
``POLL_FIRST`` to ``POLL_MAX`` seconds. The rules match the MCP tool's: 1 to 64 distinct
children, mode ``all``, ``any`` or ``quorum`` (with ``1 <= quorum <= len``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from delegation import errors as codes
from delegation.client.errors import InvalidParams
from delegation.client.shapes import Result

MAX_JOIN = 64
MODES = ("all", "any", "quorum")
POLL_FIRST = 0.05
POLL_MAX = 1.0
# Past any sequence: child.read answers the child's state without a page of events.
PAST_EVERY_EVENT = 2**63 - 1


@dataclass(frozen=True)
class JoinResult:
    """``{done, results}``: whether the join held, and every awaited child's ``Result`` in
    the order asked (events left to ``child_read``)."""

    done: bool
    results: list[Result]


def join_quorum(child_ids: list[str], mode: str, quorum: int | None) -> int:
    """How many children must be done; −32602 (as the MCP tool answers) for a bad join."""

    def refuse(message: str) -> InvalidParams:
        return InvalidParams(codes.INVALID_PARAMS, message)

    if not 1 <= len(child_ids) <= MAX_JOIN:
        raise refuse(f"childIds: must name 1 to {MAX_JOIN} children, got {len(child_ids)}")
    if len(set(child_ids)) != len(child_ids):
        raise refuse("childIds: each child may be named once")
    if mode not in MODES:
        raise refuse(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    if mode != "quorum":
        if quorum is not None:
            raise refuse(f"quorum: only with mode 'quorum' (mode is {mode!r})")
        return len(child_ids) if mode == "all" else 1
    if quorum is None or not 1 <= quorum <= len(child_ids):
        raise refuse(f"quorum: must be between 1 and the {len(child_ids)} children named")
    return quorum


class JoinMethods:
    """Mixed into ``RunnerClient`` (which provides ``child_read``)."""

    async def await_children(
        self,
        run_id: str,
        extension_id: str,
        generation: int,
        child_ids: list[str],
        *,
        mode: str = "all",
        quorum: int | None = None,
        wait_seconds: float = 0,
        lease_id: str | None = None,
    ) -> JoinResult:
        """Wait up to ``wait_seconds`` for the join over ``child_ids`` to hold."""
        need = join_quorum(list(child_ids), mode, quorum)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait_seconds)
        results: dict[str, Result] = {}
        pause = POLL_FIRST
        while True:
            for child_id in child_ids:
                if child_id in results and results[child_id].done:
                    continue  # a finished child stays finished
                results[child_id] = await self.child_read(
                    run_id,
                    extension_id,
                    generation,
                    child_id,
                    after=PAST_EVERY_EVENT,
                    lease_id=lease_id,
                )
            finished = sum(1 for r in results.values() if r.done)
            if finished >= need or loop.time() >= deadline:
                ordered = [results[child_id] for child_id in child_ids]
                return JoinResult(done=finished >= need, results=ordered)
            await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
            pause = min(POLL_MAX, pause * 2)

"""Joins (SPEC §9 ``await_children``): the rules of a fan-in over a caller's children.

A join names up to 64 of the caller's children and a ``mode``: ``all`` holds when every one
is done, ``any`` when one is, ``quorum`` when ``n`` are. Reading the children is
``children.read_children`` (``read_child``'s ownership rule); this module checks the request
and says whether the join holds, so the MCP door and the SDK agree on both.
"""

from __future__ import annotations

from dataclasses import dataclass

from delegation.errors import INVALID_PARAMS, RpcError
from delegation.wire.schemas import valid_id

MAX_JOIN = 64
MODES = ("all", "any", "quorum")


@dataclass(frozen=True)
class Join:
    child_ids: tuple[str, ...]
    mode: str
    quorum: int

    def holds(self, results: list[dict]) -> bool:
        finished = sum(1 for result in results if result["done"])
        return finished >= self.quorum


def check_join(child_ids: list[str], mode: str, quorum: int | None) -> Join:
    """−32602 naming the argument: 1–64 distinct ValidIDs, a known mode, ``quorum`` only with
    mode ``quorum`` and between 1 and the number of children."""
    if not 1 <= len(child_ids) <= MAX_JOIN:
        raise RpcError(
            INVALID_PARAMS,
            f"childIds: must name 1 to {MAX_JOIN} children, got {len(child_ids)}",
        )
    seen: dict[str, int] = {}
    for index, child_id in enumerate(child_ids):
        try:
            valid_id(child_id)
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, f"childIds[{index}]: {exc}") from None
        if child_id in seen:
            raise RpcError(
                INVALID_PARAMS,
                f"childIds[{index}]: {child_id!r} repeats childIds[{seen[child_id]}]",
            )
        seen[child_id] = index
    if mode not in MODES:
        raise RpcError(INVALID_PARAMS, f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    if mode != "quorum":
        if quorum is not None:
            raise RpcError(INVALID_PARAMS, f"quorum: only with mode 'quorum' (mode is {mode!r})")
        need = len(child_ids) if mode == "all" else 1
        return Join(tuple(child_ids), mode, need)
    if quorum is None:
        raise RpcError(INVALID_PARAMS, "quorum: required field missing with mode 'quorum'")
    if not 1 <= quorum <= len(child_ids):
        raise RpcError(
            INVALID_PARAMS,
            f"quorum: must be between 1 and the {len(child_ids)} children named, got {quorum}",
        )
    return Join(tuple(child_ids), mode, quorum)

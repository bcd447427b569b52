"""``kodelet.runtime.background.acquire/release`` as Canopy leases of the hosting run (§6).

A lease id is chosen here; Canopy creates the lease with the first ``child.start`` that
names it (TTL ``LEASE_TTL_SECONDS``) and the release is ``child.lease.release``, which
cancels whatever still runs under it. A lease never used for a child is released too: the
server keeps a tombstone so a late start cannot bring it back.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from delegation.runner.host import RunContext

log = logging.getLogger("canopy.runner.kodelet")


class LeaseBook:
    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.live: dict[str, str] = {}  # leaseId -> the extension's description
        self.released: list[str] = []

    def acquire(self, description: str) -> str:
        lease_id = f"lease-{uuid.uuid4().hex[:20]}"
        self.live[lease_id] = description
        return lease_id

    def current(self) -> str | None:
        """The lease a new ``kodelet`` session runs under: the newest live one.

        kodelet-subagent acquires a lease just before it starts each agent's ``kodelet``,
        so the newest is that agent's."""
        return next(reversed(self.live), None)

    def is_live(self, lease_id: str | None) -> bool:
        return lease_id is not None and lease_id in self.live

    async def release(self, lease_id: str) -> None:
        if self.live.pop(lease_id, None) is None:
            return  # released already: idempotent, as the extension may retry
        self.released.append(lease_id)
        await self.ctx.client.lease_release(
            lease_id, self.ctx.host.extension_id, self.ctx.host.generation, retry_until=15
        )

    async def release_all(self) -> None:
        for lease_id in list(self.live):
            try:
                await self.release(lease_id)
            except Exception as exc:  # the run is ending; the server expires it anyway
                log.warning("releasing lease %s failed: %s", lease_id, exc)

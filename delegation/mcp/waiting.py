"""``waitSeconds``: a tool call that waits on its child's doorbell, with progress.

While a call waits only a channel-layer receive is pending: no thread and no database
connection is held. Each ring (and every ``RECHECK_SECONDS``, for rings the layer dropped)
costs one short read.
"""

from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from mcp.server.mcpserver import Context

from delegation import notify
from delegation.errors import INVALID_PARAMS, RpcError
from delegation.mcp import credential_watch

# How often a waiting call sends notifications/progress, and re-reads the database in case a
# doorbell was lost (the channel layer may drop rings; the database is the record).
PROGRESS_SECONDS = 2.0
RECHECK_SECONDS = 5.0


def wait_seconds(value: float | None) -> float:
    if value is None:
        return 0.0
    if not 0 <= value <= settings.MCP_MAX_WAIT_SECONDS:
        raise RpcError(
            INVALID_PARAMS,
            f"waitSeconds: must be between 0 and {settings.MCP_MAX_WAIT_SECONDS}, got {value}",
        )
    return float(value)


def _caller_of(ctx: Context) -> tuple[int, int, str]:
    """The caller's run, its runner and the runner token its run token was issued under."""
    from delegation.mcp.calls import authenticate

    caller = authenticate(ctx)
    return caller.run_pk, caller.runner_pk, caller.runner_token_hash


def _run_pk_of(run_id: str) -> int | None:
    from delegation.selectors.events import run_pk_of

    return run_pk_of(run_id)


async def wait_on_run(ctx: Context, run_id: str, seconds: float, label: str, read, satisfied):
    """``wait_until`` on the doorbell of the run ``run_id``."""
    run_pk = await database_sync_to_async(_run_pk_of)(run_id)
    return await wait_until(ctx, run_pk, seconds, label, read, satisfied)


async def wait_until(
    ctx: Context, run_pk, seconds: float, label: str, read, satisfied, *, caller=None
):
    """Read, then wait on the run's doorbell and read again until ``satisfied`` or time is up.

    ``run_pk`` is one run's pk or a list of them (``await_children`` waits on every awaited
    child's doorbell with one channel). Joins the doorbell groups on a fresh channel before
    the first read, so no ring is missed between them; and the caller's runner's credentials
    group, so a rotated or revoked token wakes the call at once. ``read`` authenticates the
    caller's run token again each time (``calls.call_service``): the ring is a doorbell, the
    record says whether the token still holds. ``caller`` (run pk, runner pk, runner token
    hash) is the caller's run token's, read from ``ctx`` when not given.
    """
    layer = get_channel_layer()
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + seconds
    channel = await layer.new_channel() if layer is not None else None
    run_pks = run_pk if isinstance(run_pk, list | tuple) else [run_pk]
    groups = [notify.run_group(pk) for pk in run_pks]
    # The caller's own run too: its run token dies with it (a cancel, a budget stop).
    if caller is None:
        caller = await database_sync_to_async(_caller_of)(ctx)
    own_run, runner_pk, token_hash = caller
    groups += [notify.run_group(own_run), notify.credentials_group(runner_pk)]
    groups = list(dict.fromkeys(groups))
    if channel is not None:
        for group in groups:
            await layer.group_add(group, channel)
        credential_watch.watch(layer, channel, runner_pk, token_hash)
    receiving: asyncio.Future | None = None
    try:
        result = await read()
        last_read = loop.time()
        last_progress = None
        while not satisfied(result):
            now = loop.time()
            if now >= deadline:
                break
            # At most one progress notification per PROGRESS_SECONDS: a chatty child rings
            # the doorbell on every event, and each would otherwise be a stored progress
            # record of the waiting agent (a Copilot parent stored 21 in 6 s).
            if last_progress is None or now - last_progress >= PROGRESS_SECONDS:
                await ctx.report_progress(round(now - started, 1), seconds, f"waiting for {label}")
                last_progress = now
            tick = min(PROGRESS_SECONDS - (now - last_progress), deadline - now)
            if channel is None:
                await asyncio.sleep(tick)
                rang = False
            else:
                if receiving is None:
                    receiving = asyncio.ensure_future(layer.receive(channel))
                done, _ = await asyncio.wait({receiving}, timeout=tick)
                rang = bool(done)
                if rang:
                    receiving = None
            if rang or loop.time() - last_read >= RECHECK_SECONDS or loop.time() >= deadline:
                result = await read()
                last_read = loop.time()
        return result
    finally:
        if receiving is not None:
            receiving.cancel()
        if channel is not None:
            credential_watch.forget(channel)
            for group in groups:
                await layer.group_discard(group, channel)

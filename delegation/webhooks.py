"""The webhook sender: claims due deliveries and POSTs them, from the upkeep loop only.

Asynchronous HTTP (httpx) on the server's event loop, with short timeouts and a bound on
concurrent POSTs, so a receiver that hangs or is down costs one pending coroutine each and
never a blocked loop, request or ingest; the database work runs on the ORM's thread
(``database_sync_to_async``). What is sent and how it is signed: ``services.alerts``.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from delegation.services import alerts

log = logging.getLogger(__name__)

USER_AGENT = "Canopy-Webhooks/1"


def make_client() -> httpx.AsyncClient:
    timeout = settings.WEBHOOK_TIMEOUT_SECONDS
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout, connect=min(timeout, 3.0)),
        follow_redirects=False,
        # The environment's proxies are not for webhooks to this machine's own receivers.
        trust_env=False,
        headers={"User-Agent": USER_AGENT},
    )


async def post(client: httpx.AsyncClient, job: alerts.Job) -> str:
    """Send one delivery and record the attempt; returns the outcome."""
    body = job.body.encode("utf-8")
    headers = {
        "Content-Type": "application/json",
        alerts.SIGNATURE_HEADER: alerts.sign(job.secret, body),
        "X-Canopy-Delivery": job.delivery_id,
        "X-Canopy-Event": job.kind,
    }
    started_at = timezone.now()
    began = time.monotonic()
    status_code, error = None, ""
    try:
        # httpx's timeouts bound each read, not the whole exchange: a receiver dripping bytes
        # could hold the POST for ever, and past the claim another process would send again.
        async with asyncio.timeout(2 * settings.WEBHOOK_TIMEOUT_SECONDS):
            async with client.stream("POST", job.url, content=body, headers=headers) as response:
                status_code = response.status_code
                if not 200 <= status_code < 300:
                    error = f"HTTP {status_code}: {await _start_of(response)}"
    except (httpx.HTTPError, TimeoutError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    duration_ms = int((time.monotonic() - began) * 1000)
    return await database_sync_to_async(alerts.record_attempt)(
        job.pk,
        started_at=started_at,
        duration_ms=duration_ms,
        status_code=status_code,
        error=error,
    )


async def _start_of(response: httpx.Response, limit: int = 200) -> str:
    """The first bytes of an error answer, for the attempt log; never the whole body."""
    start = b""
    async for chunk in response.aiter_raw():
        start += chunk
        if len(start) >= limit:
            break
    return start[:limit].decode("utf-8", errors="replace")


async def deliver_due(client: httpx.AsyncClient | None = None) -> list[str]:
    """Claim what is due and send it concurrently; the outcomes, once all are recorded."""
    jobs = await database_sync_to_async(alerts.claim_due)(settings.WEBHOOK_CONCURRENCY)
    if not jobs:
        return []
    if client is not None:
        return list(await asyncio.gather(*(post(client, job) for job in jobs)))
    async with make_client() as own:
        return list(await asyncio.gather(*(post(own, job) for job in jobs)))


async def deliver_forever() -> None:
    """The upkeep loop's sender: every sweep interval, whatever is due."""
    async with make_client() as client:
        while True:
            await asyncio.sleep(settings.MAINTENANCE_INTERVAL_SECONDS)
            try:
                await deliver_due(client)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook sender failed; retrying")

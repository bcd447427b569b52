"""The webhook sender: claims due deliveries and POSTs them, from the upkeep loop only.

Asynchronous HTTP (httpx) on the server's event loop, with short timeouts and a bound on
concurrent POSTs, so a receiver that hangs or is down costs one pending coroutine each and
never a blocked loop, request or ingest; the database work runs on the ORM's thread
(``database_sync_to_async``). What is sent and how it is signed: ``services.webhooks``.

Each delivery is sent on its own task (``Sender``): a receiver that hangs holds its own slot
until its timeout, while every other delivery is claimed and retried on schedule.

Every connection goes through ``CheckedBackend``: the name is resolved once, every address
is checked against ``webhooks.refused_address`` (https: public only; http: loopback only) and
the connection is made to a checked address, never to a second lookup, so a name that
resolves to a private or metadata address (now, or only after the webhook was saved) gets
nothing. Nothing of an answer's body is read or stored, only its status.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from urllib.parse import urlsplit

import httpcore
import httpx
from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from delegation.services import webhooks
from delegation.services.webhooks import targets

log = logging.getLogger(__name__)

USER_AGENT = "Canopy-Webhooks/1"

# The scheme of the delivery being connected: the address rules differ for http and https,
# and a network backend sees only a host and a port.
_scheme: contextvars.ContextVar[str] = contextvars.ContextVar("webhook_scheme")


class TargetRefused(httpcore.ConnectError):
    """The receiver's name resolves to an address a delivery may not go to."""


class CheckedBackend(httpcore.AsyncNetworkBackend):
    """Resolve, check every address, then connect to a checked one (see the module doc)."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend | None = None):
        self.inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self, host, port, timeout=None, local_address=None, socket_options=None
    ) -> httpcore.AsyncNetworkStream:
        scheme = _scheme.get("https")
        try:
            addresses = await asyncio.to_thread(targets.resolve_host, host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"{host!r} does not resolve: {exc}") from None
        for address in addresses:
            reason = webhooks.refused_address(address, scheme=scheme)
            if reason is not None:
                raise TargetRefused(f"{host!r} resolves to {reason}")
        last: Exception | None = None
        for address in addresses:
            try:
                return await self.inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:
                last = exc
        raise last or httpcore.ConnectError(f"{host!r} has no address")

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise httpcore.ConnectError("webhooks do not use unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def make_client() -> httpx.AsyncClient:
    timeout = settings.WEBHOOK_TIMEOUT_SECONDS
    # The environment's proxies are not for webhooks to this machine's own receivers.
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    # httpx takes no network backend; its pool (httpcore) does. The pool is rebuilt with the
    # same TLS context around the checked backend (tests/security/test_webhook_targets.py
    # fails if a newer httpx stops honouring this).
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False),
        network_backend=CheckedBackend(),
    )
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(timeout, connect=min(timeout, 3.0)),
        follow_redirects=False,
        trust_env=False,
        headers={"User-Agent": USER_AGENT},
    )


def signed_headers(job: webhooks.Job, body: bytes, now: float | None = None) -> dict[str, str]:
    """The headers of one attempt: the body's signature, and the timestamped one."""
    timestamp = str(int(time.time() if now is None else now))
    return {
        "Content-Type": "application/json",
        webhooks.SIGNATURE_HEADER: webhooks.sign(job.secret, body),
        webhooks.TIMESTAMP_HEADER: timestamp,
        webhooks.TIMESTAMP_SIGNATURE_HEADER: webhooks.sign_timestamped(job.secret, timestamp, body),
        "X-Canopy-Delivery": job.delivery_id,
        "X-Canopy-Event": job.kind,
    }


async def post(client: httpx.AsyncClient, job: webhooks.Job) -> str:
    """Send one delivery and record the attempt; returns the outcome."""
    body = job.body.encode("utf-8")
    headers = signed_headers(job, body)
    started_at = timezone.now()
    began = time.monotonic()
    status_code, error = None, ""
    scheme = _scheme.set(urlsplit(job.url).scheme)
    try:
        # httpx's timeouts bound each read, not the whole exchange: a receiver dripping bytes
        # could hold the POST for ever, and past the claim another process would send again.
        async with asyncio.timeout(2 * settings.WEBHOOK_TIMEOUT_SECONDS):
            async with client.stream("POST", job.url, content=body, headers=headers) as response:
                status_code = response.status_code
                if not 200 <= status_code < 300:
                    # The status only: an answer's body is the receiver's, not ours to keep.
                    error = f"HTTP {status_code}"
    except (httpx.HTTPError, TimeoutError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, TargetRefused) else None
        error = f"refused: {cause}" if cause else f"{type(exc).__name__}: {exc}"
        error = error[:500]
    finally:
        _scheme.reset(scheme)
    duration_ms = int((time.monotonic() - began) * 1000)
    return await database_sync_to_async(webhooks.record_attempt)(
        job.pk,
        started_at=started_at,
        duration_ms=duration_ms,
        status_code=status_code,
        error=error,
    )


async def deliver_due(client: httpx.AsyncClient | None = None) -> list[str]:
    """Claim what is due and send it concurrently; the outcomes, once all are recorded."""
    jobs = await database_sync_to_async(webhooks.claim_due)(settings.WEBHOOK_CONCURRENCY)
    if not jobs:
        return []
    if client is not None:
        return list(await asyncio.gather(*(post(client, job) for job in jobs)))
    async with make_client() as own:
        return list(await asyncio.gather(*(post(own, job) for job in jobs)))


class Sender:
    """Claims due deliveries up to the free slots and sends each on a task of its own.

    ``deliver_due`` waits for its whole batch, so one receiver hanging until its timeout held
    back every other delivery's retry; here a sweep never waits for a send.
    """

    def __init__(self, client: httpx.AsyncClient):
        self.client = client
        self.sending: set[asyncio.Task] = set()
        self.outcomes: list[str] = []

    async def sweep(self) -> int:
        """Start sending what is due; how many deliveries were started."""
        free = settings.WEBHOOK_CONCURRENCY - len(self.sending)
        if free <= 0:
            return 0
        jobs = await database_sync_to_async(webhooks.claim_due)(free)
        for job in jobs:
            task = asyncio.ensure_future(self._send(job))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)
        return len(jobs)

    async def _send(self, job: webhooks.Job) -> None:
        try:
            self.outcomes.append(await post(self.client, job))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("webhook delivery %s failed; it is retried when its claim ends", job.pk)

    async def wait(self) -> None:
        """Until every started delivery is recorded."""
        while self.sending:
            await asyncio.gather(*self.sending, return_exceptions=True)

    def stop(self) -> None:
        for task in self.sending:
            task.cancel()


async def deliver_forever() -> None:
    """The upkeep loop's sender: every sweep interval, whatever is due."""
    async with make_client() as client:
        sender = Sender(client)
        try:
            while True:
                await asyncio.sleep(settings.MAINTENANCE_INTERVAL_SECONDS)
                try:
                    await sender.sweep()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("webhook sender failed; retrying")
        finally:
            sender.stop()

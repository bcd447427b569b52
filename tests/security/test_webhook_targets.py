"""Webhooks against SSRF and replay (issue 21): targets that are, or resolve to, private,
link-local, loopback (for https) or cloud metadata addresses are refused when a webhook is
saved and again before every connection; no answer body is stored; every attempt carries a
timestamp signed with the body.

No traffic leaves the machine: names resolve through a patched resolver (and the socket
module's own lookup is patched the same way, in case anything bypassed the checked one), and
any connection to a non-loopback address is refused and recorded before it is made. The
receivers are real HTTP servers on loopback.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import socket
import time

import anyio
import pytest
from channels.db import database_sync_to_async
from django.test import Client

from delegation import webhooks
from delegation.errors import RpcError
from delegation.models import WebhookAttempt, WebhookDelivery
from delegation.services import webhooks as alerts
from delegation.services.run_actions import Actor
from delegation.services.webhooks import targets
from tests.support.personas import api_token
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)
adb = database_sync_to_async
SECRET = "s3cret-s3cret-s3cret"


class Names:
    """A resolver from a fixed map: what DNS would answer for these names, and nothing else."""

    def __init__(self, monkeypatch):
        self.map: dict[str, list[str]] = {}
        self.off_machine: list[str] = []
        real_getaddrinfo = socket.getaddrinfo

        def getaddrinfo(host, port, *args, **kwargs):
            host = host.decode() if isinstance(host, bytes) else host
            if host in self.map:
                return [
                    (
                        socket.AF_INET6 if ":" in a else socket.AF_INET,
                        socket.SOCK_STREAM,
                        6,
                        "",
                        (a, int(port or 0)),
                    )
                    for a in self.map[host]
                ]
            try:
                ipaddress.ip_address(host)
            except ValueError:
                if host != "localhost":
                    raise socket.gaierror(
                        socket.EAI_NONAME, f"{host}: not in the test's map"
                    ) from None
            return real_getaddrinfo(host, port, *args, **kwargs)

        real_connect = anyio.connect_tcp

        async def connect_tcp(remote_host, remote_port, **kwargs):
            address = getaddrinfo(str(remote_host), remote_port)[0][4][0]
            if not ipaddress.ip_address(address).is_loopback:
                self.off_machine.append(str(remote_host))
                raise OSError(f"test: no connection off the machine ({remote_host})")
            return await real_connect(remote_host, remote_port, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(anyio, "connect_tcp", connect_tcp)
        monkeypatch.setattr(
            targets,
            "resolve_host",
            lambda host, port: [a[4][0] for a in getaddrinfo(host, port)],
            raising=False,  # so that the tests also run (and fail) on the code before the fix
        )


@pytest.fixture
def names(monkeypatch) -> Names:
    return Names(monkeypatch)


def create(admin, url: str):
    actor = Actor.for_user(admin, via="api")
    return alerts.do_create_webhook(actor, url=url, kinds=["run-failed"], secret=SECRET).webhook


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://169.254.169.254/latest/meta-data/", "cloud metadata address"),
        ("https://metadata.google.internal/computeMetadata/v1/", "cloud metadata service"),
        ("https://[fd00:ec2::254]/", "cloud metadata address"),
        ("https://10.0.0.1/", "private address"),
        ("https://192.168.1.20:8443/hook", "private address"),
        ("https://[::ffff:10.0.0.1]/", "private address"),
        # Issue 35: IPv6 forms that carry an IPv4 address to a translator or tunnel.
        ("https://[64:ff9b::a9fe:a9fe]/", "embeds 169.254.169.254"),
        ("https://[64:ff9b::7f00:1]/", "embeds 127.0.0.1"),
        ("https://[64:ff9b:1::a00:1]/", "embeds 10.0.0.1"),
        ("https://[2002:a9fe:a9fe::1]/", "embeds 169.254.169.254"),
        ("https://[2002:c0a8:114::1]/", "embeds 192.168.1.20"),
        ("https://[::a9fe:a9fe]/", "embeds 169.254.169.254"),
        ("https://[::a00:1]/", "embeds 10.0.0.1"),
        ("https://[::ffff:169.254.169.254]/", "embeds 169.254.169.254"),
        ("https://[2001:0:4136:e378:8000:63bf:f5ff:fefe]/", "embeds 10.0.1.1"),
        ("https://[::ffff:0:a9fe:a9fe]/", "embeds 169.254.169.254"),  # SIIT
        # The local-use NAT64 prefix in a /48 translator's layout (RFC 6052): the last 32 bits
        # say 8.8.8.8, the translator reads 169.254.169.254 from bits 48-63 and 72-87.
        ("https://[64:ff9b:1:a9fe:a9:fe00:808:808]/", "embeds 169.254.169.254"),
        ("https://[64:ff9b:1:a9:fe:a9fe:808:808]/", "embeds 0.169.254.169"),  # /56 layout
        ("https://v6.example/", "'v6.example' resolves to 64:ff9b::a9fe:a9fe"),
        ("https://169.254.10.1/", "link-local"),
        ("https://[fe80::1]/", "link-local"),
        ("https://0.0.0.0/", "not a public address"),
        ("https://127.0.0.1/", "loopback"),
        ("https://localhost/", "loopback"),
        ("https://internal.example/hook", "'internal.example' resolves to 10.20.30.40"),
        ("https://imds.example/", "'imds.example' resolves to 169.254.169.254"),
    ],
)
def test_it_refuses_to_save_a_webhook_aimed_inside_the_network(names, admin, url, says):
    names.map["internal.example"] = ["10.20.30.40"]
    names.map["imds.example"] = ["93.184.215.9", "169.254.169.254"]
    names.map["v6.example"] = ["64:ff9b::a9fe:a9fe"]
    with pytest.raises(RpcError, match="url: ") as refused:
        create(admin, url)
    assert says in refused.value.message
    answer = Client().post(
        "/api/webhooks",
        {"url": url, "kinds": ["run-failed"]},
        "application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_token(admin)}",
    )
    message = answer.json()["error"]["message"]
    # REST answers the service's reason (IPv6 literals too), never a regular expression.
    assert answer.status_code == 422 and says in message and "^" not in message, message
    assert names.off_machine == []


@pytest.mark.parametrize(
    "url",
    [
        "https://Hooks.Example.COM/x",  # upper case: a URL parser lowers the host
        # An AWS Lambda function URL: a 32-character label in a 60+ character name.
        "https://abcdefghijklmnopqrstuvwxyz012345.lambda-url.eu-central-1.on.aws/",
        "https://[2606:4700:4700::1111]:8443/hook",  # a public IPv6 literal
        "https://[64:ff9b::5db8:d709]/hook",  # NAT64 to a public IPv4 address
    ],
)
def test_it_saves_over_rest_the_https_urls_a_url_parser_accepts(names, admin, url):
    answer = Client().post(
        "/api/webhooks",
        {"url": url, "kinds": ["run-failed"]},
        "application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_token(admin)}",
    )
    assert answer.status_code == 201, answer.content
    assert answer.json()["url"] == url
    assert names.off_machine == []


def test_it_says_in_words_what_is_wrong_with_a_url(names, admin):
    answer = Client().post(
        "/api/webhooks",
        {"url": "ftp://hooks.example/x", "kinds": ["run-failed"]},
        "application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_token(admin)}",
    )
    assert answer.status_code == 422
    assert answer.json()["error"]["message"] == (
        "url: scheme must be https (or http to loopback), not 'ftp'"
    )


def test_it_saves_public_names_and_plain_http_to_loopback(names, admin):
    names.map["hooks.example"] = ["93.184.215.10"]  # public (never connected to: see Names)
    assert create(admin, "https://hooks.example/x").url == "https://hooks.example/x"
    # A name that does not resolve yet is checked again before every send.
    assert create(admin, "https://not-yet.example/x").url == "https://not-yet.example/x"
    for url in ("http://127.0.0.1:9/x", "http://localhost:9/x", "http://[::1]:9/x"):
        assert create(admin, url).url == url
    assert names.off_machine == []


async def _send_one(admin, url: str, receiver: Receiver | None = None) -> WebhookDelivery:
    hook = await adb(create)(admin, url)
    await adb(alerts.do_send_test)(Actor.for_user(admin, via="api"), hook)
    assert await webhooks.deliver_due() in (["retry"], ["delivered"])
    return await adb(lambda: WebhookDelivery.objects.select_related("webhook").get(webhook=hook))()


async def test_it_refuses_at_send_time_a_name_that_now_resolves_to_loopback_for_https(names, admin):
    with Receiver() as receiver:
        port = receiver.server.server_address[1]
        names.map["rebind.example"] = ["93.184.215.11"]  # public when the webhook is saved
        hook = await adb(create)(admin, f"https://rebind.example:{port}/hook")
        await adb(alerts.do_send_test)(Actor.for_user(admin, via="api"), hook)
        names.map["rebind.example"] = ["127.0.0.1"]  # ... and this machine when it is sent
        assert await webhooks.deliver_due() == ["retry"]
        assert receiver.connections == 0 and receiver.requests == []
    [attempt] = await adb(lambda: list(WebhookAttempt.objects.all()))()
    assert attempt.status_code is None
    assert attempt.error == "refused: 'rebind.example' resolves to 127.0.0.1 is loopback " + (
        "(for a receiver on this machine use http://127.0.0.1)"
    )
    assert names.off_machine == []


async def test_it_refuses_at_send_time_a_name_that_now_resolves_to_the_metadata_service(
    names, admin
):
    names.map["rebind.example"] = ["93.184.215.12"]
    hook = await adb(create)(admin, "https://rebind.example/hook")
    await adb(alerts.do_send_test)(Actor.for_user(admin, via="api"), hook)
    names.map["rebind.example"] = ["169.254.169.254"]
    assert await webhooks.deliver_due() == ["retry"]
    [attempt] = await adb(lambda: list(WebhookAttempt.objects.all()))()
    assert "169.254.169.254 is a cloud metadata address" in attempt.error
    assert names.off_machine == [], "a connection was attempted"


async def test_it_sends_plain_http_to_a_loopback_name_through_the_checked_address(names, admin):
    with Receiver() as receiver:
        port = receiver.server.server_address[1]
        delivery = await _send_one(admin, f"http://localhost:{port}/hook")
        assert delivery.state == "delivered" and len(receiver.requests) == 1
    assert names.off_machine == []


async def test_it_keeps_the_status_of_an_error_answer_and_none_of_its_body(admin):
    with Receiver(statuses=[500]) as receiver:
        delivery = await _send_one(admin, receiver.url)
        assert len(receiver.requests) == 1
    [attempt] = await adb(lambda: list(WebhookAttempt.objects.filter(delivery=delivery)))()
    # The receiver answered 500 with a body ("ok"); only the status is recorded.
    assert (attempt.status_code, attempt.error) == (500, "HTTP 500")
    assert delivery.last_error == "HTTP 500"


async def test_it_signs_the_timestamp_with_the_body(admin):
    with Receiver() as receiver:
        before = int(time.time())
        await _send_one(admin, receiver.url)
        after = int(time.time())
        [request] = receiver.requests
    timestamp = request.headers["x-canopy-timestamp"]
    assert before <= int(timestamp) <= after
    # Written from the documentation, not with the code under test.
    expected = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + request.body, hashlib.sha256)
    assert request.headers["x-canopy-timestamp-signature"] == f"sha256={expected.hexdigest()}"
    # The body's own signature is unchanged (SPEC §10).
    plain = hmac.new(SECRET.encode(), request.body, hashlib.sha256).hexdigest()
    assert request.headers["x-canopy-signature"] == f"sha256={plain}"
    signature = request.headers["x-canopy-timestamp-signature"]
    assert alerts.verify_timestamped(SECRET, request.body, timestamp, signature)
    # A replay later, or with another timestamp, does not verify.
    later = int(timestamp) + alerts.TIMESTAMP_TOLERANCE_SECONDS + 1
    assert not alerts.verify_timestamped(SECRET, request.body, timestamp, signature, now=later)
    assert not alerts.verify_timestamped(SECRET, request.body, str(after + 1), signature)


async def test_it_retries_one_receiver_on_time_while_another_hangs(admin, settings):
    settings.MAINTENANCE_INTERVAL_SECONDS = 0.05
    settings.WEBHOOK_RETRY_FIRST_SECONDS = 0.2
    settings.WEBHOOK_TIMEOUT_SECONDS = 5  # the hanging POST is held up to 10 s
    actor = Actor.for_user(admin, via="api")
    with Receiver(hang=True) as stuck, Receiver(statuses=[500, 200]) as flaky:
        for receiver in (stuck, flaky):
            await adb(alerts.do_send_test)(actor, await adb(create)(admin, receiver.url))
        sender = asyncio.ensure_future(webhooks.deliver_forever())
        try:
            deadline = time.monotonic() + 4
            while len(flaky.requests) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            # The flaky receiver got its retry on its own schedule, while the stuck one is
            # still holding its first POST.
            assert len(flaky.requests) == 2, "the retry waited for the hanging receiver"
            assert len(stuck.requests) == 1 and not stuck.released.is_set()
        finally:
            stuck.released.set()
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

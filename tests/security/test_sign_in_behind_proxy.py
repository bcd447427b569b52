"""Sign-in throttling behind a proxy: five bad passwords lock out the guesser's address, not
the user for everyone who comes through the same proxy (the key was ``REMOTE_ADDR``, which
behind a proxy is the proxy's). Requests go through the real middleware and axes backend."""

import pytest
from django.test import Client

from tests.support.personas import PASSWORD

pytestmark = pytest.mark.django_db

PROXY = "10.0.0.2"  # REMOTE_ADDR of every request that came through the proxy


def via_proxy(*hops: str) -> Client:
    """A client whose requests arrive from the proxy with ``X-Forwarded-For: hops``."""
    return Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=", ".join(hops))


def guess_until_locked(client: Client, username: str, limit: int) -> None:
    for n in range(limit):
        client.post("/login/", {"username": username, "password": f"guess-{n}"})
    assert client.post("/login/", {"username": username, "password": PASSWORD}).status_code == 429


def test_it_locks_out_only_the_guessers_address_behind_one_proxy(settings, viewer):
    settings.CANOPY_TRUSTED_PROXIES = 1
    guess_until_locked(via_proxy("203.0.113.7"), viewer.username, settings.AXES_FAILURE_LIMIT)
    # The same user through the same proxy from another address still signs in.
    other = via_proxy("198.51.100.2")
    assert (
        other.post("/login/", {"username": viewer.username, "password": PASSWORD}).status_code
        == 302
    )


def test_it_keys_on_the_entry_the_trusted_proxies_wrote_not_a_forged_one(settings, viewer):
    settings.CANOPY_TRUSTED_PROXIES = 2
    # The client forges a leftmost entry each time; the outer proxy wrote 203.0.113.7.
    for n in range(settings.AXES_FAILURE_LIMIT):
        forged = via_proxy(f"192.0.2.{n}", "203.0.113.7", "10.0.0.1")
        forged.post("/login/", {"username": viewer.username, "password": f"guess-{n}"})
    again = via_proxy("192.0.2.99", "203.0.113.7", "10.0.0.1")
    assert (
        again.post("/login/", {"username": viewer.username, "password": PASSWORD}).status_code
        == 429
    )
    fine = via_proxy("203.0.113.8", "10.0.0.1")
    assert (
        fine.post("/login/", {"username": viewer.username, "password": PASSWORD}).status_code == 302
    )


def test_it_ignores_forwarded_for_without_trusted_proxies(settings, viewer):
    settings.CANOPY_TRUSTED_PROXIES = 0
    # Direct clients: a header the client wrote itself does not move it to a fresh key.
    for n in range(settings.AXES_FAILURE_LIMIT):
        Client(REMOTE_ADDR="203.0.113.7", HTTP_X_FORWARDED_FOR=f"192.0.2.{n}").post(
            "/login/", {"username": viewer.username, "password": f"guess-{n}"}
        )
    spoofer = Client(REMOTE_ADDR="203.0.113.7", HTTP_X_FORWARDED_FOR="192.0.2.200")
    assert (
        spoofer.post("/login/", {"username": viewer.username, "password": PASSWORD}).status_code
        == 429
    )

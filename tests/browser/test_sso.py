"""Single sign-on through a real OpenID provider (issue 28): the certified ``oidc-provider``
package on Node, Canopy's daphne configured for it, Chromium signing in.

One provider and one server for the module (tests/support/oidc.py); each test signs in a
person of its own so the provider's directory edits of one test never touch another's.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
import requests
from websockets.asyncio.client import connect

from delegation import roles
from delegation.models import AuditEntry, SsoIdentity
from delegation.protocol import CLOSE_FORBIDDEN
from delegation.services import tokens
from tests.support.browser import needs_chromium
from tests.support.personas import api_token, make_person
from tests.support.sso import sign_in_with_provider

pytestmark = [needs_chromium, pytest.mark.django_db(transaction=True)]

# The live socket re-checks every half second here (the defaults: 10 s heartbeats, 900 s
# between the provider's re-checks), and password sign-in is off as an organisation sets it.
SSO_ENV = {
    "LIVE_HEARTBEAT_SECONDS": "0.5",
    "OIDC_RECHECK_SECONDS": "0.5",
    "OIDC_LOCAL_PASSWORDS": "false",
}


def _role(login: str) -> str | None:
    identity = SsoIdentity.objects.select_related("user").get(subject=login)
    return roles.role_of(identity.user)


def _rewrite(param: str, value: str):
    def route(url: str) -> str:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        query[param] = value
        return urlunsplit(parts._replace(query=urlencode(query)))

    return route


def _signed_in(page, stack) -> bool:
    response = page.request.get(f"{stack.url}/trees/", max_redirects=0)
    return response.status == 200


def test_it_signs_in_through_the_provider_with_the_role_of_the_group(sso_stack, browser):
    sso_stack.set_groups("alice", ["canopy-ops", "unrelated"])
    page = browser()
    page.goto(f"{sso_stack.url}/login/")
    # Password sign-in is off: only the provider's button.
    assert page.locator("[data-action=sign-in-sso]").inner_text() == "Sign in with Test IdP"
    assert page.locator("input[name=password]").count() == 0
    sign_in_with_provider(page, sso_stack, "alice")
    assert "/trees/" in page.url
    assert _role("alice") == roles.OPERATOR
    user = SsoIdentity.objects.get(subject="alice").user
    assert user.email == "alice@example.test" and not user.has_usable_password()
    assert AuditEntry.objects.filter(action="sso.sign_in", outcome="ok", user=user).exists()


def test_it_changes_the_role_at_the_next_sign_in_and_sign_out_ends_the_session(sso_stack, browser):
    sso_stack.set_groups("bob", ["canopy-admins"])
    page = browser()
    sign_in_with_provider(page, sso_stack, "bob")
    assert _role("bob") == roles.ADMIN
    page.goto(f"{sso_stack.url}/retention/")
    assert page.locator("#retention-preview").count() == 1

    sso_stack.set_groups("bob", ["canopy-viewers"])
    page.click("[data-action=sign-out]")
    page.wait_for_url(f"{sso_stack.url}/login/**")
    assert not _signed_in(page, sso_stack)
    # The provider still has its own session: straight back, with the groups read again.
    sign_in_with_provider(page, sso_stack, "bob")
    assert _role("bob") == roles.VIEWER
    assert page.goto(f"{sso_stack.url}/retention/").status == 403


def test_it_refuses_a_user_whose_groups_map_to_no_role_before_showing_anything(sso_stack, browser):
    sso_stack.set_groups("mallory", ["marketing"])
    page = browser()
    sign_in_with_provider(page, sso_stack, "mallory")
    assert "sso=norole" in page.url
    assert "no role in Canopy" in page.locator("[data-sso=norole]").inner_text()
    assert not _signed_in(page, sso_stack)
    assert not SsoIdentity.objects.filter(subject="mallory").exists()
    assert AuditEntry.objects.filter(
        action="sso.sign_in", target_id="mallory", outcome="refused: no mapped group"
    ).exists()


@pytest.mark.parametrize("param", ["state", "nonce"])
def test_it_refuses_a_tampered_state_or_nonce(sso_stack, browser, param):
    login = f"tamper-{param}"
    sso_stack.set_groups(login, ["canopy-admins"])
    page = browser()
    # The browser's request to the provider carries another state (or nonce) than the one
    # Canopy keeps in the session: the provider answers with it, and Canopy must refuse.
    sign_in_with_provider(page, sso_stack, login, route=_rewrite(param, "forged-" + "x" * 32))
    assert "sso=failed" in page.url
    assert not _signed_in(page, sso_stack)
    assert not SsoIdentity.objects.filter(subject=login).exists()


def test_it_closes_a_live_socket_when_the_group_is_removed(sso_stack, browser):
    sso_stack.set_groups("carol", ["canopy-viewers"])
    page = browser()
    sign_in_with_provider(page, sso_stack, "carol")
    cookies = {c["name"]: c["value"] for c in page.context.cookies(sso_stack.url)}

    async def follow() -> tuple[list[str], int | None]:
        url = f"ws://127.0.0.1:{sso_stack.server.port}/ws/live/"
        headers = {"Cookie": f"sessionid={cookies['sessionid']}", "Origin": sso_stack.url}
        kinds = []
        async with connect(url, additional_headers=headers) as ws:
            kinds.append(json.loads(await ws.recv())["type"])
            kinds.append(json.loads(await ws.recv())["type"])  # a heartbeat: re-checked, kept
            sso_stack.set_groups("carol", ["marketing"])
            try:
                while True:
                    kinds.append(json.loads(await asyncio.wait_for(ws.recv(), 10))["type"])
            except Exception:
                pass
            return kinds, ws.close_code

    # Playwright's sync API runs a loop in this thread: the socket gets a thread of its own.
    with ThreadPoolExecutor(1) as pool:
        kinds, code = pool.submit(asyncio.run, follow()).result(timeout=30)
    assert kinds[:2] == ["hello", "heartbeat"]
    assert code == CLOSE_FORBIDDEN
    assert _role("carol") is None
    assert AuditEntry.objects.filter(action="sso.role", target_id="carol").exists()


def test_it_keeps_api_tokens_working(sso_stack):
    token = api_token(make_person("operator"))
    answer = requests.get(
        f"{sso_stack.url}/api/runs", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code == 200


def test_it_takes_the_role_from_pages_and_api_tokens_once_the_group_is_removed(sso_stack, browser):
    """Issue 35: a user removed from the provider's group kept the role on pages, REST and
    API tokens (only the live socket re-checked)."""
    sso_stack.set_groups("dave", ["canopy-ops"])
    page = browser()
    sign_in_with_provider(page, sso_stack, "dave")
    identity = SsoIdentity.objects.select_related("user").get(subject="dave")
    assert identity.access_token  # kept from the sign-in, to ask the provider again
    _api, token = tokens.create_api_token(identity.user, "dave's script")
    runs = f"{sso_stack.url}/api/runs"
    auth = {"Authorization": f"Bearer {token}"}
    assert requests.get(runs, headers=auth, timeout=10).status_code == 200
    assert _signed_in(page, sso_stack)
    sso_stack.set_groups("dave", ["marketing"])
    time.sleep(0.7)  # past OIDC_RECHECK_SECONDS
    answer = requests.get(runs, headers=auth, timeout=10)
    assert answer.status_code == 403, answer.text
    assert _role("dave") is None
    assert not _signed_in(page, sso_stack)  # the page session is signed out
    # Back in the group: the token acts again, as the provider says.
    sso_stack.set_groups("dave", ["canopy-viewers"])
    time.sleep(0.7)
    assert requests.get(runs, headers=auth, timeout=10).status_code == 200
    assert _role("dave") == "viewer"

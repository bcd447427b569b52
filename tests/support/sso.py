"""A real OpenID provider for the single sign-on tests: the certified ``oidc-provider``
package on Node (tests/support/oidc/, installed by ``make oidc-provider``), and a Canopy
server configured to sign in through it.

``sso_stack`` (module scope) starts both: the provider knows the server's callback, the server
knows the provider's issuer. ``stack.set_groups(login, [...])`` rewrites the provider's
directory, read again on every lookup, as a directory admin moving a user between groups.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from canopy.serving import free_port
from tests.support.live_server import DaphneServer

HERE = Path(__file__).resolve().parent / "oidc"  # package.json, provider.js
CLIENT_ID = "canopy-test"
CLIENT_SECRET = "canopy-test-client-secret-0123456789"
# The directory's groups, as the server's OIDC_GROUP_ROLES maps them.
GROUP_ROLES = "canopy-viewers=viewer,canopy-ops=operator,canopy-admins=admin"


def provider_installed() -> bool:
    return (HERE / "node_modules" / "oidc-provider" / "package.json").exists()


@dataclass
class SsoStack:
    issuer: str
    server: DaphneServer
    accounts: Path
    provider: subprocess.Popen

    def set_groups(self, login: str, groups: list[str]) -> None:
        directory = json.loads(self.accounts.read_text())
        directory[login] = {"groups": groups, "email": f"{login}@example.test"}
        tmp = self.accounts.with_suffix(".tmp")
        tmp.write_text(json.dumps(directory))
        tmp.replace(self.accounts)  # whole or not at all: the provider may read it any moment

    @property
    def url(self) -> str:
        return self.server.http_url


def start_provider(port: int, accounts: Path, redirect_uri: str) -> subprocess.Popen:
    assert provider_installed(), "the test OpenID provider is missing: run make oidc-provider"
    process = subprocess.Popen(
        [
            "node",
            str(HERE / "provider.js"),
            str(port),
            str(accounts),
            CLIENT_ID,
            CLIENT_SECRET,
            redirect_uri,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 20
    line = process.stdout.readline()
    if not line.startswith("ready") or time.monotonic() > deadline:
        process.kill()
        raise RuntimeError(f"the OpenID provider did not start: {line!r}")
    return process


@pytest.fixture(scope="module")
def sso_stack(request, django_db_setup, django_db_blocker):
    """The provider and a server signed in through it; the module's ``SSO_ENV`` adds settings."""
    workdir = Path(tempfile.mkdtemp(prefix="canopy-oidc-"))
    accounts = workdir / "accounts.json"
    accounts.write_text("{}")
    provider_port, server_port = free_port(), free_port()
    issuer = f"http://127.0.0.1:{provider_port}"
    provider = start_provider(
        provider_port, accounts, f"http://127.0.0.1:{server_port}/oidc/callback/"
    )
    env = {
        "OIDC_ISSUER": issuer,
        "OIDC_CLIENT_ID": CLIENT_ID,
        "OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_SCOPES": "openid email profile groups",
        "OIDC_GROUP_ROLES": GROUP_ROLES,
        "OIDC_PROVIDER_NAME": "Test IdP",
        **getattr(request.module, "SSO_ENV", {}),
    }
    server = DaphneServer({k: str(v) for k, v in env.items()}, port=server_port)
    try:
        server.start()
        yield SsoStack(issuer=issuer, server=server, accounts=accounts, provider=provider)
    finally:
        server.close()
        provider.kill()
        provider.wait()


def sign_in_with_provider(page, stack: SsoStack, login: str, route=None):
    """From Canopy's sign-in page through the provider's login form; ``route`` (a function of
    the authorization URL) may rewrite the URL Canopy sends the browser to."""
    if route is not None:
        # Canopy's redirect to the provider, rewritten on its way to the browser.
        def rewrite(playwright_route):
            answer = playwright_route.fetch(max_redirects=0)
            location = route(answer.headers["location"])
            playwright_route.fulfill(status=302, headers={**answer.headers, "location": location})

        page.route(lambda url: url.startswith(f"{stack.url}/oidc/start/"), rewrite)
    page.goto(f"{stack.url}/login/")
    page.click("[data-action=sign-in-sso]")

    def back_at_canopy(url: str) -> bool:
        return url.startswith(stack.url) and ("sso=" in url or "/login/" not in url)

    page.wait_for_url(lambda url: "/interaction/" in url or back_at_canopy(url))
    if "/interaction/" in page.url:  # no session at the provider yet: its login form
        page.fill("input[name=login]", login)
        page.fill("input[name=password]", "any")
        page.click("button[type=submit]")
        page.wait_for_url(back_at_canopy)

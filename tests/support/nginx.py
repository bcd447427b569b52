"""nginx (Debian's package) in front of live daphne servers, with the site config shipped in
``deploy/nginx/canopy.conf`` rendered on a free port (``canopy.proxy.ForegroundNginx``): what
the tests run through is what a deployment installs.

``nginx_factory(servers)`` → a running :class:`Nginx` (its own foreground process, not the
system's service); all are stopped after the test. ``.ci/run`` installs the package.
"""

from __future__ import annotations

import pytest

from canopy.proxy import ForegroundNginx

__all__ = ["Nginx", "nginx_factory"]


class Nginx(ForegroundNginx):
    @property
    def ws_url(self) -> str:
        return f"{self.ws_base}/ws/runner/"

    @property
    def live_url(self) -> str:
        return f"{self.ws_base}/ws/live/"


@pytest.fixture
def nginx_factory():
    started: list[Nginx] = []

    def start(servers) -> Nginx:
        proxy = Nginx([server.port for server in servers])
        started.append(proxy)
        return proxy.start()

    yield start
    for proxy in started:
        print(f"--- nginx log (port {proxy.port}) ---\n{proxy.log()}")
        proxy.close()

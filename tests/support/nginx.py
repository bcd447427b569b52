"""nginx (Debian's package) in front of live daphne servers, with the site config shipped in
``deploy/nginx/canopy.conf`` rendered on a free port: what the tests run through is what a
deployment installs.

``nginx_factory(servers)`` → a running :class:`Nginx` (its own foreground process, not the
system's service); all are stopped after the test. ``.ci/run`` installs the package.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from canopy.proxy import render_main, render_site
from canopy.serving import PROJECT_DIR, answers, free_port

__all__ = ["Nginx", "nginx_factory"]

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
# The fixture serves the app's static folder as it is; a deployment's is collectstatic's.
STATIC_ROOT = PROJECT_DIR / "dashboard" / "static"


class Nginx:
    def __init__(self, upstream_ports: list[int]):
        self.work_dir = Path(tempfile.mkdtemp(prefix="canopy-nginx-"))
        self.port = free_port()
        site = render_site(
            listen=f"127.0.0.1:{self.port}",
            upstreams=[f"127.0.0.1:{port}" for port in upstream_ports],
            static_root=STATIC_ROOT,
        )
        self.config = self.work_dir / "nginx.conf"
        self.config.write_text(render_main(site, work_dir=self.work_dir))
        self.log_path = self.work_dir / "error.log"
        self.process: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/runner/"

    @property
    def live_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/live/"

    def start(self, timeout: float = 10.0) -> Nginx:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [NGINX, "-c", str(self.config), "-p", str(self.work_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.process.returncode}:\n{self.log()}")
            if answers("127.0.0.1", self.port, timeout=0.2):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx did not answer on {self.port}:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-20000:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # SIGTERM: nginx's fast shutdown
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.work_dir, ignore_errors=True)


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

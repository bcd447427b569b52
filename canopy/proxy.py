"""The nginx site shipped in ``deploy/nginx/canopy.conf``, filled in for a given set of daphne
processes: ``python -m canopy.proxy --listen 80 --upstream 127.0.0.1:8001 --upstream ...``
prints it. The test fixture (``tests.support.nginx``) renders the same file, so what the
tests run through is what a deployment installs."""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from canopy.serving import PROJECT_DIR, answers, free_port

SITE_TEMPLATE = PROJECT_DIR / "deploy" / "nginx" / "canopy.conf"


def render_site(
    *,
    listen: str,
    upstreams: list[str],
    static_root: str | Path,
    server_name: str = "_",
    template: Path = SITE_TEMPLATE,
) -> str:
    if not upstreams:
        raise ValueError("at least one upstream daphne process is needed")
    text = template.read_text()
    fields = {
        "@UPSTREAM_SERVERS@": "\n".join(f"    server {address};" for address in upstreams),
        "@LISTEN@": listen,
        "@SERVER_NAME@": server_name,
        "@STATIC_ROOT@": str(static_root).rstrip("/"),
    }
    for key, value in fields.items():
        if key not in text:
            raise ValueError(f"{template}: no {key} to fill")
        text = text.replace(key, value)
    return text


def render_main(site: str, *, work_dir: Path, error_log: str = "stderr") -> str:
    """A whole nginx.conf around ``site`` for an nginx of its own (not Debian's service):
    in the foreground, with its pid, temp files and logs under ``work_dir``."""
    temp = "\n".join(
        f"    {kind}_temp_path {work_dir / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    # Started as root, nginx's workers drop to nobody, who cannot read a checkout under an
    # owner-only directory (a CI clone in a mkdtemp): this nginx's workers stay its owner.
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};\n" if os.geteuid() == 0 else ""
    return f"""{user}daemon off;
worker_processes 1;
pid {work_dir / "nginx.pid"};
error_log {error_log} warn;
events {{ worker_connections 4096; }}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log off;
{temp}
{site}
}}
"""


class ForegroundNginx:
    """nginx of its own (not the system's service) with the shipped site in front of
    ``upstream_ports`` on a free port: for the tests and the bench. The app's static folder
    stands in for collectstatic's output."""

    def __init__(self, upstream_ports: list[int], static_root: Path | None = None):
        self.work_dir = Path(tempfile.mkdtemp(prefix="canopy-nginx-"))
        self.port = free_port()
        site = render_site(
            listen=f"127.0.0.1:{self.port}",
            upstreams=[f"127.0.0.1:{port}" for port in upstream_ports],
            static_root=static_root or PROJECT_DIR / "dashboard" / "static",
        )
        self.config = self.work_dir / "nginx.conf"
        self.config.write_text(render_main(site, work_dir=self.work_dir))
        self.log_path = self.work_dir / "error.log"
        self.process: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_base(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> ForegroundNginx:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [nginx, "-c", str(self.config), "-p", str(self.work_dir)],
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m canopy.proxy", description=__doc__)
    parser.add_argument("--listen", default="80")
    parser.add_argument("--upstream", action="append", default=[], help="HOST:PORT, repeated")
    parser.add_argument("--static-root", default="/var/lib/canopy/staticfiles")
    parser.add_argument("--server-name", default="_")
    args = parser.parse_args(argv)
    upstreams = args.upstream or ["127.0.0.1:8001", "127.0.0.1:8002"]
    sys.stdout.write(
        render_site(
            listen=args.listen,
            upstreams=upstreams,
            static_root=args.static_root,
            server_name=args.server_name,
        )
    )


if __name__ == "__main__":
    main()

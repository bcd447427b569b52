"""The nginx site shipped in ``deploy/nginx/canopy.conf``, filled in for a given set of daphne
processes: ``python -m canopy.proxy --listen 80 --upstream 127.0.0.1:8001 --upstream ...``
prints it. The test fixture (``tests.support.nginx``) renders the same file, so what the
tests run through is what a deployment installs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from canopy.serving import PROJECT_DIR

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
    return f"""daemon off;
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

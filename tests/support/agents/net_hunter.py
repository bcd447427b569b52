"""A hostile agent that tries to reach what its preset did not name (issue 33).

``net_hunter.py SERVER_PORT LISTENER_PORT MODEL_PORT``: straight TCP to PostgreSQL, Redis, a
loopback listener the test opened and the server's port outside ``/mcp``; then through its
``HTTPS_PROXY`` to the same, to a private and a metadata address, and to what it was given
(``/mcp``, its model endpoint). Prints one JSON report: per attempt, what came back.
"""

import json
import os
import socket
import sys
from urllib.parse import urlsplit


def straight(port: int, payload: bytes = b"") -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
            if payload:
                sock.sendall(payload)
            sock.settimeout(3)
            answer = sock.recv(200)
            return "connected: " + answer.decode("latin-1", "replace")[:60]
    except OSError as exc:
        return f"refused: {exc.__class__.__name__}"


def via_proxy(request: bytes) -> str:
    proxy = urlsplit(os.environ["HTTPS_PROXY"])
    try:
        with socket.create_connection((proxy.hostname, proxy.port), timeout=3) as sock:
            sock.sendall(request)
            sock.settimeout(5)
            answer = sock.recv(300).decode("latin-1", "replace")
            return answer.split("\r\n", 1)[0]
    except OSError as exc:
        return f"error: {exc.__class__.__name__}"


def main() -> None:
    server, listener, model = (int(a) for a in sys.argv[1:4])
    get = b"GET /api/runners HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    report = {
        "proxy": os.environ.get("HTTPS_PROXY", ""),
        "straight": {
            "postgres": straight(5432),
            "redis": straight(6379, b"PING\r\n"),
            "listener": straight(listener),
            "server-api": straight(server, get),
            "model": straight(model, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"),
        },
        "proxied": {},
    }
    for name, target in {
        "postgres": "127.0.0.1:5432",
        "redis": "127.0.0.1:6379",
        "listener": f"127.0.0.1:{listener}",
        "server": f"127.0.0.1:{server}",
        "private": "10.20.30.40:80",
        "metadata": "169.254.169.254:80",
        "mapped-metadata": "[::ffff:169.254.169.254]:80",
    }.items():
        report["proxied"][f"CONNECT {name}"] = via_proxy(
            f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()
        )
    for name, url in {
        "server-api": f"http://127.0.0.1:{server}/api/runners",
        "metadata": "http://169.254.169.254/latest/meta-data/",
        "mcp": f"http://127.0.0.1:{server}/mcp",
    }.items():
        report["proxied"][f"GET {name}"] = via_proxy(
            f"GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""The one daphne command line every launcher uses (make serve, the demo, tests, bench)."""

from __future__ import annotations

import sys
from pathlib import Path

# Daphne drops a WebSocket whose message exceeds its own limit (1 MiB by default) without a
# word. The runner protocol refuses frames over 1 MiB with a JSON-RPC error on a connection
# that stays open (SPEC §5), so daphne lets larger messages through to the consumer; beyond
# this bound daphne still drops the connection, which caps what one message can cost.
WEBSOCKET_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


def daphne_command(host: str, port: int) -> list[str]:
    daphne = Path(sys.executable).with_name("daphne")
    program = [str(daphne)] if daphne.exists() else [sys.executable, "-m", "daphne"]
    limit = str(WEBSOCKET_MAX_MESSAGE_BYTES)
    return program + [
        "-b",
        host,
        "-p",
        str(port),
        "--websocket-max-message-size",
        limit,
        "--websocket-max-frame-size",
        limit,
        "dashboard.asgi:application",
    ]


if __name__ == "__main__":
    # python -m dashboard.serving HOST PORT: replace this process with the server.
    import os

    command = daphne_command(sys.argv[1], int(sys.argv[2]))
    os.execv(command[0], command)

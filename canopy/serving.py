"""The one daphne launcher: ``make serve``, the demo, the tests and the bench all start here."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

PROJECT_DIR = Path(__file__).resolve().parent.parent

# Daphne drops a WebSocket whose message exceeds its own limit (1 MiB by default) without a
# word. The runner protocol refuses frames over 1 MiB with a JSON-RPC error on a connection
# that stays open (SPEC §5), so daphne lets larger messages through to the consumer; beyond
# this bound daphne still drops the connection, which caps what one message can cost.
WEBSOCKET_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


class ServerDidNotStart(RuntimeError):
    pass


def daphne_command(host: str, port: int, fd: int | None = None) -> list[str]:
    """The daphne command line; with ``fd``, daphne serves a socket already listening there."""
    daphne = Path(sys.executable).with_name("daphne")
    program = [str(daphne)] if daphne.exists() else [sys.executable, "-m", "daphne"]
    limit = str(WEBSOCKET_MAX_MESSAGE_BYTES)
    bind = ["--fd", str(fd)] if fd is not None else ["-b", host, "-p", str(port)]
    return program + [
        *bind,
        "--websocket-max-message-size",
        limit,
        "--websocket-max-frame-size",
        limit,
        "canopy.asgi:application",
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reachable_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def answers(host: str, port: int, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((reachable_host(host), port), timeout=timeout):
            return True
    except OSError:
        return False


def responds(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether an HTTP request to ``host:port`` gets any answer (not only a TCP accept)."""
    try:
        with socket.create_connection((reachable_host(host), port), timeout=timeout) as sock:
            sock.sendall(b"HEAD /login/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            return sock.recv(1).startswith(b"H")
    except OSError:
        return False


def start_server(
    host: str,
    port: int,
    *,
    env: dict[str, str] | None = None,
    output: IO | None = None,
    own_session: bool = False,
    timeout: float = 30.0,
) -> subprocess.Popen:
    """Start daphne serving Canopy and return once its port answers.

    ``output`` receives stdout and stderr (default: this process's). ``own_session`` keeps a
    terminal's Ctrl-C away from the server, so a supervisor can stop things in its own order.
    Raises :class:`ServerDidNotStart` if daphne exits or stays silent for ``timeout`` seconds;
    the process is stopped first, so nothing is left behind.

    ``port`` 0: this process binds a port the kernel chooses and hands daphne the listening
    socket, so no other process can take the port between choosing and binding it (as with
    :func:`free_port`). The returned process carries the port as ``.port`` either way.
    """
    listener = None
    ready = answers
    if port == 0:
        # The kernel accepts on a listening socket before daphne does: wait for an answer.
        ready = responds
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # As daphne's own sockets do: a restart on this port must not wait for the closed
        # connections of this one to time out.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(128)
        port = listener.getsockname()[1]
    try:
        process = subprocess.Popen(
            daphne_command(host, port, fd=None if listener is None else listener.fileno()),
            cwd=PROJECT_DIR,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            start_new_session=own_session,
            pass_fds=() if listener is None else (listener.fileno(),),
        )
    finally:
        if listener is not None:
            listener.close()  # daphne holds its own copy now
    process.port = port
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerDidNotStart(f"daphne exited with {process.returncode}")
        if ready(host, port, timeout=0.2 if ready is answers else 1.0):
            return process
        time.sleep(0.05)
    stop_server(process, kill=True)
    raise ServerDidNotStart(f"daphne did not answer on port {port} within {timeout:g} s")


def stop_server(process: subprocess.Popen | None, *, kill: bool = False, grace: float = 10.0):
    """SIGTERM (a clean stop) or SIGKILL (a crash); SIGKILL anyway after ``grace`` seconds."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace)


if __name__ == "__main__":
    # python -m canopy.serving HOST PORT: replace this process with the server.
    import os

    command = daphne_command(sys.argv[1], int(sys.argv[2]))
    os.execv(command[0], command)

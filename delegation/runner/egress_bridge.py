"""The agent's side of its egress proxy: run inside the sandbox, before the agent (SPEC §13).

The sandbox has its own network namespace with nothing in it but loopback, so the runner's
egress proxy (:mod:`delegation.runner.egress`) is reached through a unix socket bound into the
sandbox. This script listens inside the namespace on

- the proxy port (``HTTPS_PROXY`` / ``HTTP_PROXY`` point at it), and
- each loopback port the agent may reach directly (Canopy's ``/mcp`` when the server is on
  loopback, a model endpoint the preset names as ``127.0.0.1:PORT``): agents that skip their
  proxy for loopback addresses connect straight to these,

and relays every connection to the unix socket after one header line saying which listener it
came in on. The header selects nothing the proxy does not check again: an agent that writes
to the socket itself gets exactly what the listeners give.

Run as ``python3 -I -S egress_bridge.py SOCKET PROXY_PORT PORTS -- PROGRAM ARGS...``: it binds
its listeners, leaves a detached relay process behind (re-parented to the sandbox's init, and
killed with the sandbox) and becomes the agent with ``exec``, so the agent's pid, signals,
pipes and exit status stay the runner's. Standard library only: nothing of Canopy is importable
in the sandbox.
"""

import os
import signal
import socket
import sys
import threading

CHUNK = 65536


def _listen(port: int) -> list[tuple[socket.socket, int]]:
    """Listening sockets on both loopbacks, each with its IP version (4 or 6)."""
    out = []
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(128)
        except OSError:
            if family == socket.AF_INET:
                raise
            continue  # no IPv6 loopback in this namespace: "localhost" is 127.0.0.1 then
        out.append((sock, 4 if family == socket.AF_INET else 6))
    return out


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
        try:
            sock.shutdown(how)
        except OSError:
            pass


def _relay(client: socket.socket, path: str, header: bytes) -> None:
    try:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(path)
        upstream.sendall(header)
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _accept(listener: socket.socket, path: str, header: bytes) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            continue
        threading.Thread(target=_relay, args=(client, path, header), daemon=True).start()


def _serve(listeners: list[tuple[socket.socket, bytes]], path: str) -> None:
    # The agent's graceful stop (SIGTERM to its process group) must not cut its network first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the agent's pipes: the runner reads them to their end
        os.dup2(null, fd)
    for listener, header in listeners:
        threading.Thread(target=_accept, args=(listener, path, header), daemon=True).start()
    threading.Event().wait()


def main(argv: list[str]) -> None:
    if len(argv) < 6 or argv[4] != "--":
        sys.exit("usage: egress_bridge.py SOCKET PROXY_PORT PORTS -- PROGRAM [ARGS...]")
    path, proxy_port = argv[1], int(argv[2])
    ports = [int(p) for p in argv[3].split(",") if p]
    program = argv[5:]
    listeners = [(sock, b"PROXY\n") for sock, _version in _listen(proxy_port)]
    for port in ports:
        # The runner's side connects to the loopback the agent used: a grant of [::1]:PORT
        # is that server, not whatever listens on 127.0.0.1:PORT.
        listeners += [(sock, b"FORWARD %d %d\n" % (port, v)) for sock, v in _listen(port)]
    if os.fork() == 0:
        os.setsid()  # not in the agent's process group: nothing it signals reaches the relay
        if os.fork() == 0:
            _serve(listeners, path)
        os._exit(0)
    os.wait()
    for listener, _ in listeners:
        listener.close()
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv)

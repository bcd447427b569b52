"""Issue 33 / SPEC §13: an agent under a default preset reaches its model and ``/mcp``, and
nothing else on the host or the network; every refusal of the egress proxy is a run event.

The real runner command line (``manage.py runner``, root on CI, and without privileges under
``setpriv``) against a real daphne server; the agent is ``net_hunter.py``, which tries
PostgreSQL, Redis, a listener this test opens, the server's REST API, a private and a metadata
address, straight and through its proxy.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from asgiref.sync import sync_to_async

from delegation.models import Event, Run
from delegation.services import tokens
from tests.security import test_containment
from tests.security.test_containment import (
    PYTHON,
    SYSTEM_PYTHON,
    Place,
    needs_root,
    run_runner,
    runner_env,
)
from tests.support.paths import AGENTS

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_connections"),
]

# The containment tests' places: a workspace, a directory outside it, a private one.
place = test_containment.place
shared_place = test_containment.shared_place


class Model(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"data": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def model_port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture
def listener():
    """A loopback service of the host that no preset names (it would answer "secret")."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    accepted: list[str] = []

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            accepted.append("x")
            conn.sendall(b"secret\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield sock.getsockname()[1], accepted
    sock.close()


@sync_to_async
def hunter_run() -> tuple[Run, list[str]]:
    run = Run.objects.get(parent=None)
    assert run.status == "succeeded", (run.status, run.error)
    texts = list(Event.objects.filter(run=run, kind="error").values_list("text", flat=True))
    return run, texts


async def hunt(server, place: Place, model_port: int, listener_port: int, **extra):
    _runner, token = await sync_to_async(tokens.create_runner)("net-hunted")
    shutil.copy(AGENTS / "net_hunter.py", place.workspace / "net_hunter.py")
    (place.workspace / "net_hunter.py").chmod(0o644)
    python = SYSTEM_PYTHON if extra.get("user") else PYTHON
    command = [python, "-I", "net_hunter.py", str(server.port), str(listener_port)]
    command += [str(model_port), "{mcpConfig}"]
    config = place.presets(
        {
            "name": "hunter",  # no "sandbox", no "network": the defaults
            "command": command,
            "allowHosts": [f"127.0.0.1:{model_port}"],
            **extra,
        }
    )
    await asyncio.to_thread(
        run_runner,
        server,
        config,
        place.workspace,
        ["hunt"],
        runner_env(CANOPY_RUNNER_TOKEN=token),
        "--root-profile",
        "hunter",
    )
    run, refusals = await hunter_run()
    return json.loads(run.output), refusals


def check(report: dict, refusals: list[str], server_port: int, listener_port: int) -> None:
    straight, proxied = report["straight"], report["proxied"]
    assert report["proxy"].startswith("http://127.0.0.1:"), report
    # Nothing of the host is in the agent's network namespace: the kernel refuses.
    for name in ("postgres", "redis", "listener"):
        assert straight[name].startswith("refused"), (name, straight)
    # The server's port is there (for /mcp), and answers nothing else.
    assert straight["server-api"].startswith("connected: HTTP/1.1 403"), straight
    # What the preset named is reached: its model, straight and through the proxy.
    assert straight["model"].startswith("connected: HTTP/1.0 200"), straight
    assert proxied["GET mcp"].split()[1] not in ("403", "502"), proxied
    for name in (
        "CONNECT postgres",
        "CONNECT redis",
        "CONNECT listener",
        "CONNECT server",
        "CONNECT private",
        "CONNECT metadata",
        "CONNECT mapped-metadata",
        "GET server-api",
        "GET metadata",
    ):
        assert proxied[name].startswith("HTTP/1.1 403"), (name, proxied)
    # Each refusal is an event of the run, naming the host and why.
    expected = {
        "127.0.0.1:5432": "not in the preset's allowHosts",
        "127.0.0.1:6379": "not in the preset's allowHosts",
        f"127.0.0.1:{listener_port}": "not in the preset's allowHosts",
        f"127.0.0.1:{server_port}": "Canopy's server: only /mcp",
        "10.20.30.40:80": "not in the preset's allowHosts",
        "169.254.169.254:80": "not in the preset's allowHosts",
        "::ffff:169.254.169.254:80": "not in the preset's allowHosts",
    }
    for target, reason in expected.items():
        assert f"network: refused {target}: {reason}" in refusals, (target, refusals)


async def test_it_lets_a_default_preset_agent_reach_its_model_and_mcp_only(
    daphne_server, place, model_port, listener
):
    listener_port, accepted = listener
    report, refusals = await hunt(daphne_server, place, model_port, listener_port)
    check(report, refusals, daphne_server.port, listener_port)
    assert accepted == []  # the host's service never saw a connection


@needs_root
async def test_it_holds_the_network_of_an_agent_of_an_ordinary_account(
    daphne_server, shared_place, model_port, listener
):
    # bwrap runs as that account here (no uid mapping of root's), and the proxy's socket is
    # that account's: the sandbox an unprivileged runner makes.
    listener_port, accepted = listener
    report, refusals = await hunt(
        daphne_server, shared_place, model_port, listener_port, user="nobody"
    )
    check(report, refusals, daphne_server.port, listener_port)
    assert accepted == []

"""Which pinned agent CLIs send their model requests through ``HTTP_PROXY`` (issue 33): a
sandboxed agent reaches a model that is not on its loopback only through the egress proxy.

Each CLI runs (unsandboxed, its private HOME) with ``HTTP_PROXY``/``HTTPS_PROXY`` pointing at a
recorder and its model URL at ``127.0.0.2`` (loopback, but not a listener the sandbox's bridge
opens, and not in ``NO_PROXY``): a CLI that honours its proxy asks the recorder for that URL.
The tests of every agent tree (``tests/agents/``) run them sandboxed, their stub model reached
on the bridge's loopback listener, which needs no proxy support at all.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading

import pytest

from tests.support.agents.claude_cli import claude_bin, offline_env
from tests.support.agents.other_clis import (
    agent_bin,
    codex_provider_args,
    copilot_env,
    gemini_env,
    private_home,
)

pytestmark = pytest.mark.timeout(90)


class Recorder:
    """A proxy that records the first request line of each connection and closes it (an
    answer such as 502 makes some CLIs back off for long); it is ``seen`` once one asks for
    the model (other hosts come first: telemetry, updates)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.lines: list[str] = []
        self.seen = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    head = conn.recv(4096).decode("latin-1")
                except OSError:
                    continue
                self.lines.append(head.split("\r\n", 1)[0])
                if "127.0.0.2:19009" in self.lines[-1]:
                    self.seen.set()


def _run_until_asked(argv, env, cwd, recorder: Recorder) -> list[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        recorder.seen.wait(45)
    finally:
        proc.kill()
        proc.wait()
    return recorder.lines


# Nothing listens there: only a proxy can answer (not port 9: fetch refuses "bad ports").
MODEL = "http://127.0.0.2:19009"


def _proxied(env: dict, recorder: Recorder) -> dict:
    proxy = {"HTTP_PROXY": recorder.url, "HTTPS_PROXY": recorder.url}
    proxy |= {"http_proxy": recorder.url, "https_proxy": recorder.url}
    proxy["NO_PROXY"] = proxy["no_proxy"] = "localhost,127.0.0.1,::1"
    return {**env, **proxy}


def _claude(tmp_path):
    env = offline_env(MODEL, tmp_path / "home")
    return [claude_bin(), "-p", "hi", "--output-format", "stream-json", "--verbose"], env


def _codex(tmp_path):
    env = {"PATH": "/usr/bin:/bin", **private_home(tmp_path / "home"), "STUB_API_KEY": "k"}
    env["PATH"] = f"{agent_bin('codex').rsplit('/', 1)[0]}:{env['PATH']}"
    argv = [agent_bin("codex"), "exec", *codex_provider_args(MODEL), "--json"]
    return [*argv, "--skip-git-repo-check", "hi"], env


def _gemini(tmp_path):
    env = {"PATH": "/usr/bin:/bin", **private_home(tmp_path / "home"), **gemini_env(MODEL)}
    # API-key auth and a trusted folder, as the runner's {mcpConfig} settings give it.
    settings = tmp_path / "home" / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
    env["GEMINI_CLI_TRUST_WORKSPACE"] = "true"
    env["PATH"] = f"{agent_bin('gemini').rsplit('/', 1)[0]}:{env['PATH']}"
    return [agent_bin("gemini"), "--output-format", "stream-json", "--prompt=hi"], env


def _copilot(tmp_path):
    env = {"PATH": "/usr/bin:/bin", **private_home(tmp_path / "home"), **copilot_env(MODEL)}
    env["PATH"] = f"{agent_bin('copilot').rsplit('/', 1)[0]}:{env['PATH']}"
    return [agent_bin("copilot"), "--prompt=hi", "--output-format", "json"], env


@pytest.mark.parametrize("cli", [_claude, _codex, _gemini, _copilot], ids=lambda f: f.__name__[1:])
def test_it_sends_model_requests_through_the_proxy(cli, tmp_path):
    recorder = Recorder()
    argv, env = cli(tmp_path)
    lines = _run_until_asked(argv, _proxied(env, recorder), tmp_path / "work", recorder)
    assert any("127.0.0.2:19009" in line for line in lines), lines

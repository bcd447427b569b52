"""``make demo-agents`` (issue 25): one command, real Claude Code grows a tree offline.

The test runs the Makefile target itself (its install and agents prerequisites marked done with
``-o``: CI has made them, and a test must not reinstall the venv), on free ports and a private
data directory so it never meets a developer's running demo. It reads the tree through REST,
then stops the demo with Ctrl-C and checks that none of its processes is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from delegation.runner.command import CommandEngine
from delegation.runner.demo_model import DELEGATE, REVIEW_NOTES, ROOT_MESSAGE, SHELL
from delegation.runner.presets import load_config
from tests.support.agents.claude_cli import claude_bin
from tests.support.agents.delegating import descendants, live_processes

pytestmark = pytest.mark.timeout(180)

PROJECT = Path(__file__).resolve().parents[2]
PRESETS = PROJECT / "deploy" / "presets" / "demo-claude.json"
STUB_URL = "http://127.0.0.1:8765"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    return pid in live_processes()


def get(url: str, token: str):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def post(url: str, token: str, body: dict):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_it_loads_the_shipped_demo_presets_with_the_runners_own_loader(tmp_path):
    config = load_config(PRESETS)
    # Its agents work outside the checkout (issue 33: in it they read var/dev-secret-key).
    assert "workspace" not in config
    with pytest.raises(ValueError, match="'claude': the workspace .* Canopy's"):
        CommandEngine.from_config(config, workspace=str(PROJECT))
    engine = CommandEngine.from_config(config, workspace=str(tmp_path))
    assert list(engine.presets_by_name) == ["claude"]
    preset = engine.presets_by_name["claude"]
    assert preset.name == "claude" and preset.format == "claude-stream-json"
    assert preset.command[0] == "claude"  # found on PATH: make demo-agents puts .agents first
    assert preset.env["ANTHROPIC_BASE_URL"] == STUB_URL
    assert preset.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert preset.env["ENABLE_TOOL_SEARCH"] == "false"
    assert preset.allow_hosts == ("127.0.0.1:8765",)  # the stub model, through the proxy
    # Issue 38: a write the preset does not allow is asked of Canopy, and the CLI waits for
    # the operator longer than the server keeps an approval pending (900 s).
    flag = preset.command.index("--permission-prompt-tool")
    assert preset.command[flag + 1] == "mcp__canopy__approve"
    assert int(preset.env["MCP_TOOL_TIMEOUT"]) > 900 * 1000


def test_it_grows_a_tree_of_real_claude_code_runs_in_one_command(tmp_path):
    claude_bin()  # fails, not skips, without `make agents`
    port, model_port = free_port(), free_port()
    presets = tmp_path / "demo-claude.json"
    text = PRESETS.read_text().replace(STUB_URL[7:], f"127.0.0.1:{model_port}")
    presets.write_text(text)
    env = {**os.environ, "CANOPY_DATA_DIR": str(tmp_path / "data")}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    log = (tmp_path / "demo.log").open("w+")
    make = subprocess.Popen(
        ["make", "-o", "install", "-o", "agent-claude", "-o", "var/dev-secret-key", "demo-agents"]
        + [f"PORT={port}", f"MODEL_PORT={model_port}", f"DEMO_PRESETS={presets}"]
        + [f"DEMO_WORKSPACE={tmp_path / 'workspace'}"],
        cwd=PROJECT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen: set[int] = set()
    try:
        token = api_token(env)
        base = f"http://127.0.0.1:{port}/api"
        deadline = time.monotonic() + 90
        tree = None
        asked: list[dict] = []
        while time.monotonic() < deadline:
            assert make.poll() is None, output(log)
            seen |= descendants(make.pid)
            # Issue 38: the review's shell write waits in the inbox; the operator allows it.
            if not asked:
                asked = pending_approvals(base, token)
                if asked:
                    decision = f"{base}/approvals/{asked[0]['approvalId']}/decision"
                    post(decision, token, {"decision": "allow"})
            tree = grown_tree(base, token)
            if tree:
                break
            time.sleep(1)
        assert tree, f"no tree of real Claude Code runs in 90 s:\n{output(log)}"
        print(f"tree after {90 - (deadline - time.monotonic()):.1f} s")
        assert len(asked) == 1, asked
        assert asked[0]["toolName"] == SHELL
        assert asked[0]["input"]["command"] == REVIEW_NOTES["command"]
        # Issue 38: and one lease, held by the scripted lease runner's root, to release.
        held = held_lease(base, token)
        assert held["runnerId"] == "demo-leases" and held["childCount"] == 2, held
        released = post(f"{base}/leases/{held['id']}/release", token, {"reason": "demo"})
        assert released["state"] == "released", released
        root, children = tree
        assert root["status"] == "succeeded", root
        assert ROOT_MESSAGE in root["task"] or root["task"] == "", root
        assert {c["profile"] for c in children} == {"claude"}
        assert all(c["status"] == "succeeded" for c in children), children
        out = output(log, tail=None)  # the sign-in block is near the top of a long log
        assert "user      : demo (role admin)" in out and f"127.0.0.1:{port}/" in out
    finally:
        seen |= descendants(make.pid)
        os.killpg(make.pid, signal.SIGINT)  # the terminal's Ctrl-C reaches make's group
        code = make.wait(30)
    assert not [p for p in seen if alive(p)], f"left running: {seen}\n{output(log)}"
    # make re-raises the SIGINT it got (or reports the interrupted recipe as 2).
    assert code in (0, 2, -signal.SIGINT), output(log)


def api_token(env) -> str:
    # The demo's migrate and account come first; `api_token` then works as the README pastes.
    deadline = time.monotonic() + 60
    while True:
        made = subprocess.run(
            [str(PROJECT / ".venv/bin/python"), "manage.py", "api_token", "create", "demo"],
            cwd=PROJECT,
            env=env,
            capture_output=True,
            text=True,
        )
        if made.returncode == 0:
            return made.stdout.strip().splitlines()[-1]
        assert time.monotonic() < deadline, made.stderr
        time.sleep(1)


def held_lease(base: str, token: str, timeout: float = 30.0) -> dict:
    """The one active lease, once its root has started both children under it."""
    deadline = time.monotonic() + timeout
    while True:
        items = get(f"{base}/leases?state=active", token)["items"]
        if len(items) == 1 and items[0]["childCount"] == 2:
            return items[0]
        assert len(items) <= 1, items
        assert time.monotonic() < deadline, f"no lease with two children: {items}"
        time.sleep(0.5)


def pending_approvals(base: str, token: str) -> list[dict]:
    try:
        return get(f"{base}/approvals?status=pending", token)["items"]
    except OSError:
        return []  # not serving yet


def grown_tree(base: str, token: str):
    """The demo root once it and at least one child concluded, made by the real CLI."""
    try:
        roots = get(f"{base}/runs?profile=claude", token)["items"]
    except OSError:
        return None  # not serving yet
    # A fresh data directory: the only top-level run is the demo's root.
    root = next((r for r in roots if r["depth"] == 0), None)
    if root is None or root["status"] != "succeeded":
        return None
    children = [r for r in roots if r.get("parentRunId") == root["runId"]]
    if not children:
        return None
    events = get(f"{base}/runs/{root['runId']}/events", token)["items"]
    # The CLI's own stream-json records: its tool-use of the MCP delegate, its cost line.
    uses = [e for e in events if e["kind"] == "tool-use" and e.get("toolName") == DELEGATE]
    assert uses, events
    return root, children


def output(log, tail: int | None = 4000) -> str:
    log.flush()
    log.seek(0)
    text = re.sub(r"password  : \S+", "password  : ***", log.read())
    return text[-tail:] if tail else text

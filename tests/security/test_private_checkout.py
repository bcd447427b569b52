"""A runner whose own files lie where the agent's account cannot look (a checkout cloned into
``mktemp -d``, mode 0700) still starts a proxied agent: the sandbox binds nothing of the
runner's source tree, and the egress bridge it starts first is the proxy directory's copy."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from delegation.runner import egress, process, sandbox
from delegation.runner.command import CommandPreset
from tests.security.test_containment import SYSTEM_PYTHON, needs_root

# What the agent prints once it runs: the bridge started first, bound its loopback port for the
# proxy and then became this program.
AGENT = "import os; print('agent up behind', os.environ['HTTPS_PROXY'])"


@pytest.fixture
def private_checkout(monkeypatch):
    """The bridge's source moved under a directory only root may traverse."""
    checkout = Path(tempfile.mkdtemp(prefix="canopy-checkout-"))  # 0700, root's
    source = checkout / "delegation" / "runner" / egress.BRIDGE_SOURCE.name
    source.parent.mkdir(parents=True)
    shutil.copy(egress.BRIDGE_SOURCE, source)
    monkeypatch.setattr(egress, "BRIDGE_SOURCE", source)
    yield checkout
    shutil.rmtree(checkout, ignore_errors=True)


@pytest.fixture
def workspace():
    path = Path(tempfile.mkdtemp(prefix="canopy-ws-"))
    path.chmod(0o755)  # the agent's account must reach its own workspace
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_root
async def test_it_starts_a_proxied_agent_of_another_account_from_a_private_checkout(
    private_checkout, workspace
):
    preset = CommandPreset.from_config(
        {"name": "walled", "command": [SYSTEM_PYTHON, "-I", "-c", AGENT], "user": "nobody"}
    )
    assert preset.sandboxed and preset.proxied  # the defaults
    home = sandbox.PrivateHome(preset)
    env = {"PATH": "/usr/bin:/bin", "HOME": process.home_of(preset)}
    try:
        child = await process.spawn(
            preset,
            list(preset.command),
            workspace=str(workspace),
            cwd=str(workspace),
            env=env,
            limit=1 << 16,
            home=home,
        )
        out, err = await asyncio.wait_for(child.communicate(), 30)
    finally:
        home.remove()
    assert child.returncode == 0, err.decode()
    assert out.decode().startswith("agent up behind http://127.0.0.1:"), (out, err)


def test_it_binds_nothing_of_the_runners_source_tree_into_a_proxied_sandbox(tmp_path):
    preset = CommandPreset.from_config({"name": "p", "command": [SYSTEM_PYTHON, "-c", "1"]})
    home = sandbox.PrivateHome(preset)
    egress_dir = tmp_path / "egress"
    egress_dir.mkdir()
    try:
        line = sandbox.bwrap(
            preset,
            list(preset.command),
            workspace=str(tmp_path),
            cwd=str(tmp_path),
            env={"PATH": "/usr/bin:/bin", "HOME": "/home/agent"},
            home=home,
            egress=str(egress_dir),
        )
    finally:
        home.remove()
    package = str(Path(egress.__file__).resolve().parents[1])
    sources = [line[i + 1] for i, arg in enumerate(line) if arg.endswith("bind")]
    assert not [s for s in sources if s.startswith(package)], sources
    assert (str(egress_dir), sandbox.EGRESS_DIR) in zip(line[1:], line[2:], strict=False)


@needs_root
async def test_it_keeps_the_bridge_out_of_reach_of_the_agents_account():
    """The agent's account owns its socket, not the directory the bridge lies in: an
    unsandboxed agent of the same account cannot replace what another child runs first."""
    import os
    import pwd

    nobody = pwd.getpwnam("nobody")
    proxy = egress.EgressProxy([], mcp_url=None, report=print, owner=(nobody.pw_uid, nobody.pw_gid))
    await proxy.start()
    try:
        directory, socket_file, bridge = (
            os.stat(p) for p in (proxy.directory, proxy.path, proxy.bridge)
        )
        assert directory.st_uid == 0 and directory.st_mode & 0o777 == 0o711
        assert (bridge.st_uid, bridge.st_mode & 0o777) == (0, 0o444)
        assert (socket_file.st_uid, socket_file.st_mode & 0o777) == (nobody.pw_uid, 0o600)
    finally:
        await proxy.close()

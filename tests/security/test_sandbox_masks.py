"""A root runner's agents are host root for file permissions, so root-only files in the paths
it binds are masked. Issue 33: the mask was computed once, so a 0600 file created after the
runner started was read. Now a small root (/etc) is re-checked at every start, a large one
(/usr) by the runner's mask thread; both follow the directories' mtimes."""

from __future__ import annotations

import os
import subprocess

import pytest

from delegation.runner import sandbox, sandbox_masks


@pytest.fixture
def root(tmp_path):
    base = tmp_path / "system"
    (base / "ssl").mkdir(parents=True)
    (base / "ssl" / "public.pem").write_text("public")
    for path, mode in ((base, 0o755), (base / "ssl", 0o755), (base / "ssl" / "public.pem", 0o644)):
        path.chmod(mode)  # as system paths are, whatever the suite's umask
    return base


def _masked(args: list[str]) -> set[str]:
    """The paths masked by ``sandbox_masks.masks`` arguments: /dev/null over a file, a tmpfs over a
    directory."""
    files = {
        args[i + 2] for i, a in enumerate(args) if a == "--ro-bind" and args[i + 1] == "/dev/null"
    }
    return files | {args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"}


def _secret(path) -> None:
    path.write_text("root only")
    path.chmod(0o600)


def test_it_masks_a_root_only_file_created_after_the_first_start(root):
    first = sandbox_masks.masks([str(root)])
    assert not _masked(first)
    _secret(root / "ssl" / "private.key")
    (root / "vault").mkdir(mode=0o700)
    later = _masked(sandbox_masks.masks([str(root)]))
    assert later == {str(root / "ssl" / "private.key"), str(root / "vault")}


def test_it_rechecks_a_large_root_off_the_start_path(root, monkeypatch):
    monkeypatch.setattr(sandbox_masks, "SYNC_CHECK_DIRS", 0)  # every root counts as large
    assert not _masked(sandbox_masks.masks([str(root)]))
    _secret(root / "ssl" / "late.key")
    sandbox_masks.refresh_masks()  # the mask thread's tick
    assert _masked(sandbox_masks.masks([str(root)])) == {str(root / "ssl" / "late.key")}


@pytest.mark.skipif(os.geteuid() != 0, reason="a root runner's sandbox needs root (CI is root)")
def test_it_hides_a_late_root_only_file_from_a_root_runners_agent(root):
    """Through real bubblewrap as a root runner runs it: uid 0 mapped in a user namespace."""
    secret = root / "ssl" / "late.key"
    sandbox_masks.masks([str(root)])  # the runner's first start
    _secret(secret)
    command = ["bwrap", "--unshare-user", "--uid", "65534", "--gid", "65534"]
    command += ["--ro-bind", "/", "/", *sandbox_masks.masks([str(root)]), "cat", str(secret)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    # Masked by /dev/null on a nodev bind: empty, or refused; never the file.
    assert "root only" not in done.stdout, done.stdout + done.stderr
    assert done.stdout == "" and (done.returncode == 0 or "Permission denied" in done.stderr)
    unmasked = ["bwrap", "--unshare-user", "--uid", "65534", "--gid", "65534"]
    unmasked += ["--ro-bind", "/", "/", "cat", str(secret)]
    assert subprocess.run(unmasked, capture_output=True, text=True).stdout == "root only"


def _child(workspace: str, home: str, script: str) -> subprocess.CompletedProcess:
    """One sandboxed child through the runner's own bubblewrap command line."""
    from delegation.runner.presets import AgentPreset

    preset = AgentPreset(name="p", command=["sh"])
    env = {"HOME": home, "PATH": "/usr/bin:/bin"}
    private = sandbox.PrivateHome(preset)
    try:
        argv = ["/bin/sh", "-c", script]
        args = sandbox.bwrap(
            preset, argv, workspace=workspace, cwd=workspace, env=env, home=private
        )
        return subprocess.run([*args, *argv], env=env, capture_output=True, text=True, timeout=30)
    finally:
        private.remove()


def test_it_gives_each_child_its_own_home_inside_the_workspace(tmp_path):
    """Issue 33: the demo's HOME under the workspace was the workspace's directory once bound,
    so one child's ~/.claude/settings.json (a hook) ran in every later child."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = str(workspace / "home")
    planted = _child(
        str(workspace),
        home,
        'mkdir -p "$HOME/.claude" && echo hook > "$HOME/.claude/settings.json"',
    )
    assert planted.returncode == 0, planted.stderr
    sibling = _child(
        str(workspace), home, 'cat "$HOME/.claude/settings.json" 2>/dev/null || echo none'
    )
    assert sibling.stdout.strip() == "none", sibling.stdout + sibling.stderr
    assert not (workspace / "home" / ".claude").exists()  # nothing reached the real workspace

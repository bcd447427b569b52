"""One agent process, the same way for both agent engines (``command``, ``acp``).

- :func:`environment`: the allow-list of the runner's environment (``PATH``, ``HOME``,
  ``LANG``, ``TERM``), the preset's ``env``, the child's identity in ``CANOPY_*`` variables
  and ``PANDO_DELEGATION_DEPTH`` set last; none of the runner's own environment (its token,
  server secrets) reaches an agent;
- :func:`spawn`: the process in its own process group (a cancel reaches whatever it starts),
  with pipes, optionally inside bubblewrap and/or as the preset's account;
- :func:`terminate` / :func:`stop`: SIGTERM to the group, SIGKILL after the grace;
- :func:`send_batches`: one sender per child that batches queued events into one emit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import signal
from collections.abc import Mapping

from delegation import depth as depthlib
from delegation.runner.presets import AgentPreset

log = logging.getLogger("canopy.runner.process")

# All an agent gets of the runner's environment: anything else (the runner's token,
# SECRET_KEY, DATABASE_URL, cloud credentials) stays with the runner.
PASSED_ENV = ("PATH", "HOME", "LANG", "TERM")
# What a bwrap sandbox sees of the machine, read-only: the system, not the runner's files.
SANDBOX_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")


def environment(
    preset: AgentPreset, env: Mapping[str, str], identity: Mapping[str, str], level: int
) -> dict[str, str]:
    """The child's whole environment: the allow-list, ``env`` (the preset's, resolved),
    ``identity`` (``CANOPY_*``), and the child's delegation depth."""
    out = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    if preset.user:
        out["HOME"] = pwd.getpwnam(preset.user).pw_dir
    out.update(env)
    out.update(identity)
    # Set last and explicitly: an inherited value would be the runner's level.
    return depthlib.child_env(level, out)


def bwrap(preset: AgentPreset, workspace: str, cwd: str, private: str | None = None) -> list[str]:
    """The bubblewrap prefix: the system read-only, the workspace the one writable path,
    a private /proc (no other process, the runner included, is visible), a fresh /tmp
    (with the child's own MCP configuration directory, ``private``, read-only in it)."""
    out = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--new-session"]
    for path in SANDBOX_SYSTEM + preset.read_only:
        out += ["--ro-bind-try", path, path]
    out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if private:
        out += ["--ro-bind", private, private]
    out += ["--bind", workspace, workspace, "--chdir", cwd, "--"]
    return out


async def spawn(
    preset: AgentPreset,
    argv: list[str],
    *,
    workspace: str,
    cwd: str,
    env: dict[str, str],
    limit: int,
    private: str | None = None,
) -> asyncio.subprocess.Process:
    """Start ``argv`` as the preset says (sandbox, account), pipes on all three streams."""
    if preset.sandbox == "bwrap":
        argv = bwrap(preset, workspace, cwd, private) + argv
    return await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        user=preset.user,
        # A user switch must not keep root's supplementary groups.
        extra_groups=[] if preset.user else None,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group: a cancel reaches its children
        limit=limit,
    )


def kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def terminate(process, grace: float) -> None:
    """SIGTERM to the process group; SIGKILL if the process has not exited after ``grace``."""
    kill_group(process.pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(grace):
            await process.wait()
    except TimeoutError:
        log.info("pid %s ignored SIGTERM for %.1fs; sending SIGKILL", process.pid, grace)
        kill_group(process.pid, signal.SIGKILL)


async def stop(process, grace: float) -> None:
    """End an agent that may still be running: close its stdin (a polite agent exits), then
    :func:`terminate`, then take down whatever it left in its group."""
    if process.stdin is not None:
        with contextlib.suppress(Exception):
            process.stdin.close()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.2):
            await process.wait()
    if process.returncode is None:
        await terminate(process, grace)
    kill_group(process.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        await process.wait()


async def send_batches(ctx, queue: asyncio.Queue) -> None:
    """Emit what arrives on ``queue`` until a None: everything queued since the last emit
    goes in one batch, so a chatty agent does not cost one round trip per line."""
    done = False
    while not done:
        batch = [await queue.get()]
        while not queue.empty():
            batch.append(queue.get_nowait())
        done = None in batch
        batch = [ev for ev in batch if ev is not None]
        if batch:
            await ctx.emit(*batch)

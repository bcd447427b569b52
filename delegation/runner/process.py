"""One agent process, the same way for both agent engines (``command``, ``acp``).

- :func:`environment`: the allow-list of the runner's environment (``PATH``, ``HOME``,
  ``LANG``, ``TERM``), the preset's ``env``, the child's identity in ``CANOPY_*`` variables
  and ``PANDO_DELEGATION_DEPTH`` set last; none of the runner's own environment (its token,
  server secrets) reaches an agent;
- :func:`spawn`: the process in its own process group (a cancel reaches whatever it starts),
  with pipes, in its sandbox (:mod:`delegation.runner.sandbox`) unless the preset says
  ``"sandbox": "none"``, as the preset's account if it names one;
- :func:`terminate` / :func:`stop`: SIGTERM to the group, SIGKILL after the grace;
- :func:`pause` / :func:`resume`: SIGSTOP / SIGCONT to the group (SPEC §14);
- :func:`send_batches`: one sender per child that batches queued events into one emit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import signal
from collections.abc import Callable, Mapping

from delegation import depth as depthlib
from delegation.client import event
from delegation.runner import kept_sessions, sandbox
from delegation.runner.egress import EgressProxy
from delegation.runner.mcpconfig import redact_value
from delegation.runner.presets import AgentPreset

log = logging.getLogger("canopy.runner.process")

# All an agent gets of the runner's environment: anything else (the runner's token,
# SECRET_KEY, DATABASE_URL, cloud credentials) stays with the runner.
PASSED_ENV = ("PATH", "HOME", "LANG", "TERM")


def environment(
    preset: AgentPreset, env: Mapping[str, str], identity: Mapping[str, str], level: int
) -> dict[str, str]:
    """The child's whole environment: the allow-list, ``env`` (the preset's, resolved),
    ``identity`` (``CANOPY_*``), and the child's delegation depth."""
    out = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    if preset.user:
        out["HOME"] = home_of(preset)
    out.update(env)
    out.update(identity)
    # Set last and explicitly: an inherited value would be the runner's level.
    return depthlib.child_env(level, out)


def home_of(preset: AgentPreset) -> str | None:
    """The HOME :func:`environment` gives the agent, before the preset's own ``env``."""
    if preset.user:
        return pwd.getpwnam(preset.user).pw_dir
    return os.environ.get("HOME")


async def spawn(
    preset: AgentPreset,
    argv: list[str],
    *,
    workspace: str,
    cwd: str,
    env: dict[str, str],
    limit: int,
    home: sandbox.PrivateHome | None = None,
    private: str | None = None,
    mcp_url: str | None = None,
    on_refusal: Callable[[str], None] | None = None,
) -> asyncio.subprocess.Process:
    """Start ``argv`` as the preset says (in its sandbox, with ``home`` as its HOME, and
    ``private``, its MCP configuration's directory; as its account), pipes on all three.
    Behind the egress proxy (``"network": "proxy"``) it reaches ``mcp_url`` and the preset's
    ``allowHosts``; ``on_refusal`` hears every refusal (the engines make it a run event)."""
    seccomp = proxy = None
    if preset.sandboxed:
        if home is None:
            raise ValueError("a sandboxed agent needs its private HOME")
        if preset.proxied:
            proxy = EgressProxy(
                preset.allow_hosts,
                mcp_url=mcp_url,
                report=on_refusal or (lambda text: log.warning("%s", text)),
                owner=sandbox.account(preset),
            )
            await proxy.start()
            env = {**env, **proxy_env(proxy.proxy_port())}
        seccomp = sandbox.setid_filter_fd()
        prefix = sandbox.bwrap(
            preset,
            argv,
            workspace=workspace,
            cwd=cwd,
            env=env,
            home=home,
            private=private,
            seccomp_fd=seccomp,
            egress=proxy.directory if proxy else None,
        )
        if proxy is not None:
            names = os.path.basename(proxy.path), os.path.basename(proxy.bridge)
            prefix += sandbox.bridge_argv(*names, proxy.proxy_port(), proxy.forward_ports)
        argv = prefix + argv
    try:
        process = await _exec(preset, argv, cwd=cwd, env=env, limit=limit, seccomp=seccomp)
    except BaseException:
        if proxy is not None:
            await proxy.close()
        raise
    finally:
        if seccomp is not None:
            os.close(seccomp)  # bwrap has its own copy
    if proxy is not None:
        process.egress = proxy
        task = asyncio.create_task(_close_after(process, proxy))
        _closers.add(task)
        task.add_done_callback(_closers.discard)
    # bwrap leads the process group: a SIGTERM to the whole group would end bwrap first, and
    # bwrap takes its sandbox down with SIGKILL; a cancel signals the agent instead.
    process.sandboxed = preset.sandboxed
    return process


_closers: set[asyncio.Task] = set()


def proxy_env(port: int) -> dict[str, str]:
    """The variables that point an agent's HTTP clients at the bridge; loopback addresses
    go straight to the bridge's own listeners (Canopy's /mcp, a local model endpoint)."""
    url = f"http://127.0.0.1:{port}"
    out = {name: url for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")}
    out["NO_PROXY"] = out["no_proxy"] = "localhost,127.0.0.1,::1"
    return out


def refusal_event(text: str) -> dict:
    """The run event for one refusal of the egress proxy (SPEC §13: kind ``error``, the text
    naming the host and the reason; ``error`` too, where the other error events say it)."""
    return event("error", text=text, error=text)


async def _close_after(process, proxy: EgressProxy) -> None:
    try:
        await process.wait()
    finally:
        await proxy.close()


async def _exec(preset: AgentPreset, argv, *, cwd, env, limit, seccomp):
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
        pass_fds=() if seccomp is None else (seccomp,),
    )


def kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (from /proc)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def signal_agent(process, sig: int) -> None:
    """``sig`` to the agent: its whole group, or, in a sandbox, all of it but bwrap (which
    would take its sandbox down with SIGKILL on a SIGTERM, and must stay able to reap)."""
    if not getattr(process, "sandboxed", False):
        kill_group(process.pid, sig)
        return
    for pid in members(process.pid):
        if pid != process.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def polite_stop(process) -> None:
    """SIGTERM for the agent; then SIGCONT, so a paused agent (SPEC §14) gets it too."""
    signal_agent(process, signal.SIGTERM)
    signal_agent(process, signal.SIGCONT)


def pause(process) -> None:
    """SPEC §14 ``run.pause``: every process of the agent stopped (state T)."""
    if process.returncode is None:
        signal_agent(process, signal.SIGSTOP)


def resume(process) -> None:
    if process.returncode is None:
        signal_agent(process, signal.SIGCONT)


# The engines' ``pause``/``resume`` hooks (the host calls them on run.pause / run.resume):
# the run's agent process, once spawned; one spawned while paused is stopped at once.
def pause_run(ctx) -> None:
    process = ctx.data.get("process")
    if process is not None:
        pause(process)


def resume_run(ctx) -> None:
    process = ctx.data.get("process")
    if process is not None:
        resume(process)


async def terminate(process, grace: float) -> None:
    """SIGTERM to the agent; SIGKILL to its group if it has not exited after ``grace``."""
    polite_stop(process)
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
        await ctx.wait_running()  # so the batch takes the stream's next indexes (anchors)
        batch = kept_sessions.note_anchors(ctx, [ev for ev in batch if ev is not None])
        # Every live run token out, whichever child it belongs to (an agent may have found one).
        batch = [redact_value(ev) for ev in batch if ev is not None]
        if batch:
            await ctx.emit(*batch)

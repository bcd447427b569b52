"""The bubblewrap sandbox every agent runs in unless its preset says ``"sandbox": "none"``.

Inside it an agent has:

- an unprivileged uid: a user namespace (``--unshare-user``) with uid/gid :data:`SANDBOX_UID`
  when the runner is root, or the preset's ``user`` account (bwrap then runs as that account);
  no capabilities (``--cap-drop ALL``), ``no_new_privs`` (bwrap sets it), no further user
  namespaces (``--disable-userns``: no way to gain capabilities in a nested one);
- its own pid, IPC, UTS and cgroup namespaces and a private ``/proc``: no other process, the
  runner and the server included, is visible, so no environ, cmdline or memory to read;
- the system (``/usr``, ``/etc``, ...) read-only, the program's own installation read-only (a
  virtual environment, a ``node_modules`` tree), the preset's ``readOnly`` paths (mounted after
  the private ``/tmp``, so paths under ``/tmp`` stay visible);
- a fresh ``/tmp``, and two writable paths: the workspace and a private HOME made for this
  child (the XDG and TMPDIR directories its environment names are created in it);
- of Canopy's files only its own MCP configuration, read-only;
- its own network namespace with loopback only: the egress proxy (:mod:`delegation.runner.
  egress`) through a bridge on loopback (``"network": "proxy"``, the default), or nothing
  (``"none"``); or the runner's network when the preset says ``"network": "host"``.

A root runner's user namespace maps the agent to host uid 0 for file ownership (that is what
lets it write a root-owned workspace); so files not readable by everyone in the system paths
and the program's installation (``/etc/shadow``, private keys) are masked: an empty read-only
directory or ``/dev/null`` (``sandbox_masks``). The preset's ``readOnly`` paths are granted as they are.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from delegation.runner.sandbox_masks import SYSTEM_PATHS, masks, under


class AgentPreset(Protocol):
    """What the sandbox reads of a preset (presets.AgentPreset, which imports this module)."""

    name: str
    user: str | None
    network: str
    read_only: tuple[str, ...]


log = logging.getLogger("canopy.runner.sandbox")

# What a sandbox sees of the machine, read-only: the system, not the runner's files.
# The agent's uid and gid inside the user namespace of a root runner (nobody/nogroup).
SANDBOX_UID = SANDBOX_GID = 65534
# Where a sandbox sees its egress proxy's directory: the socket and the bridge that relays to it.
EGRESS_DIR = "/run/canopy-egress"
# The bridge needs only the standard library: the system's python3 where there is one (under
# /usr, readable by any account, nothing more to bind), else the runner's own interpreter.
BRIDGE_PYTHON = next(
    (p for p in ("/usr/bin/python3", "/bin/python3") if os.access(p, os.X_OK)),
    os.path.realpath(sys.executable),
)
# Directories an agent's environment may point into its HOME or /tmp: made to exist there.
ENV_DIRS = ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "TMPDIR")


def account(preset: AgentPreset) -> tuple[int, int] | None:
    """The (uid, gid) the agent runs as on the host, when the preset names an account."""
    if not preset.user:
        return None
    entry = pwd.getpwnam(preset.user)
    return entry.pw_uid, entry.pw_gid


class PrivateHome:
    """A per-child HOME (mode 0700, owned by the agent's account), removed by :meth:`remove`."""

    def __init__(self, preset: AgentPreset):
        self.path = tempfile.mkdtemp(prefix="canopy-home-")
        owner = account(preset)
        if owner:
            try:
                os.chown(self.path, *owner)
            except BaseException:
                self.remove()
                raise

    def make(self, home: str, env: Mapping[str, str]) -> None:
        """Create, inside this private HOME, the directories ``env`` names under ``home``."""
        owner = None
        with contextlib.suppress(OSError):
            st = os.stat(self.path)
            owner = (st.st_uid, st.st_gid)
        for name in ENV_DIRS:
            value = env.get(name, "")
            if not value.startswith(home.rstrip("/") + "/"):
                continue
            inside = Path(self.path) / os.path.relpath(value, home)
            inside.mkdir(parents=True, exist_ok=True, mode=0o700)
            if owner:
                for part in [inside, *inside.parents]:
                    if str(part) == self.path:
                        break
                    os.chown(part, *owner)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def installation(program: str, path: str) -> list[tuple[str, str]]:
    """(source, destination) read-only binds that make ``program`` run inside the sandbox.

    A program in the system paths needs nothing; one in a virtual environment needs the
    environment and the Python it was made from; one in a ``node_modules`` tree needs the tree;
    one in ``<prefix>/bin`` beside a ``<prefix>/lib`` (a Python built into its own directory)
    needs the prefix; anything else needs its own file. The path it is called by is kept (a venv's interpreter
    must be started as the venv's, not as the Python behind its symlink).
    """
    found = program if "/" in program else shutil.which(program, path=path)
    if not found:
        return []
    given = os.path.abspath(found)
    real = os.path.realpath(given)
    if under(real, SYSTEM_PATHS) and under(given, SYSTEM_PATHS):
        return []
    binds: list[tuple[str, str]] = []
    venv = _venv_root(given)
    if venv:
        binds.append((os.path.realpath(venv), venv))
        home = _venv_home(venv)
        if home and not under(home, SYSTEM_PATHS):
            prefix = os.path.dirname(os.path.realpath(home))
            binds.append((prefix, prefix))
        return _with_real(binds)
    for candidate in (given, real):
        marker = "/node_modules/"
        if marker in candidate:
            tree = candidate.split(marker, 1)[0] + "/node_modules"
            binds.append((os.path.realpath(tree), tree))
    if binds:
        return _with_real(binds)
    prefix = _prefix(real)
    binds.append((prefix, prefix) if prefix else (real, given))
    if prefix and given != real:
        binds.append((real, given))
    return _with_real(binds)


def _prefix(program: str) -> str | None:
    """The installation ``program`` belongs to (``<prefix>/bin/program`` with a
    ``<prefix>/lib``: a Python or Node built into its own directory), unless that is a home
    directory or ``~/.local``, which hold far more than programs."""
    bin_dir = os.path.dirname(program)
    prefix = os.path.dirname(bin_dir)
    if os.path.basename(bin_dir) != "bin" or not os.path.isdir(os.path.join(prefix, "lib")):
        return None
    homes = {e.pw_dir.rstrip("/") for e in pwd.getpwall()} | {os.path.expanduser("~")}
    if prefix in homes or prefix in {h + "/.local" for h in homes} or prefix in ("", "/"):
        return None
    return prefix


INTERPRETERS = ("python", "node", "sh", "bash", "dash", "zsh", "ruby", "perl", "deno", "bun")


def script_of(argv: list[str], cwd: str) -> str | None:
    """The script file an interpreter command line runs (``python3 -I agent.py ...``), if any:
    it is part of the program, so it is visible (read-only) in the sandbox."""
    name = os.path.basename(argv[0]) if argv else ""
    if not any(
        name == i or name.startswith(i + "3") or name.startswith(i + "-") for i in INTERPRETERS
    ):
        if not (name.startswith("python") and name[6:].replace(".", "").isdigit()):
            return None
    for arg in argv[1:]:
        if arg in ("-c", "-m", "-e", "--eval", "-"):
            return None  # code or a module, not a file
        if arg.startswith("-"):
            continue
        path = os.path.join(cwd, arg)
        return os.path.abspath(path) if os.path.isfile(path) else None
    return None


def _with_real(binds: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each source at its own path as well: symlinks inside resolve to it."""
    out: list[tuple[str, str]] = []
    for source, dest in binds:
        for pair in ((source, dest), (source, source)):
            if pair not in out:
                out.append(pair)
    return out


def _venv_root(program: str) -> str | None:
    parent = os.path.dirname(os.path.dirname(program))
    return parent if os.path.isfile(os.path.join(parent, "pyvenv.cfg")) else None


def _venv_home(venv: str) -> str | None:
    with contextlib.suppress(OSError):
        for line in Path(venv, "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                return value.strip()
    return None


def bwrap(
    preset: AgentPreset,
    argv: list[str],
    *,
    workspace: str,
    cwd: str,
    env: Mapping[str, str],
    home: PrivateHome,
    private: str | None = None,
    seccomp_fd: int | None = None,
    egress: str | None = None,
) -> list[str]:
    """The bubblewrap command line that runs the agent (everything before its argv);
    ``egress`` is the directory of the child's egress proxy socket (``"network": "proxy"``),
    bound at :data:`EGRESS_DIR` with its copy of the bridge, which :func:`bridge_argv` starts."""
    out = ["bwrap", "--die-with-parent", "--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    if seccomp_fd is not None:
        out += ["--seccomp", str(seccomp_fd)]
    if os.geteuid() == 0 and not preset.user:
        out += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    # No --new-session: the runner already starts bwrap in a session of its own, without a
    # terminal, and keeping one process group lets a cancel's SIGTERM reach the agent itself.
    out += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if preset.network != "host":
        out += ["--unshare-net"]  # loopback only: the egress proxy's bridge listens there
    readable = [*SYSTEM_PATHS]
    for path in SYSTEM_PATHS:
        out += ["--ro-bind-try", path, path]
    # Name resolution where /etc/resolv.conf links out of /etc (systemd-resolved's /run file):
    # that one file, not the rest of /run (its sockets). Behind the proxy the proxy resolves.
    resolver = os.path.realpath("/etc/resolv.conf")
    if preset.network == "host" and not under(resolver, SYSTEM_PATHS):
        out += ["--ro-bind-try", resolver, resolver]
    out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    # HOME before the read-only binds: an interpreter installed under the runner's HOME
    # (~/.pyenv) stays visible on top of the private one.
    home_dir = env.get("HOME") or "/home/agent"
    home.make(home_dir, env)
    out += ["--bind", home.path, home_dir]
    for name in ENV_DIRS:
        value = env.get(name, "")
        if value.startswith("/tmp/") and not value.startswith(home_dir.rstrip("/") + "/"):
            out += ["--dir", value]
    binds = installation(argv[0], env.get("PATH", ""))
    if egress is not None:
        # The bridge (standard library only) runs on the runner's own interpreter.
        if not under(BRIDGE_PYTHON, SYSTEM_PATHS):
            binds += installation(BRIDGE_PYTHON, "")
        out += ["--ro-bind", egress, EGRESS_DIR]
    script = script_of(argv, cwd)
    if script and not under(script, (workspace,)):
        binds += _with_real([(os.path.realpath(script), script)])
    for source, dest in binds:
        out += ["--ro-bind", source, dest]
        readable.append(dest)
    if os.geteuid() == 0 and not preset.user:
        out += masks(readable)
    # After the private /tmp: a readOnly path under /tmp stays visible. Not masked: the preset
    # grants these paths as they are.
    for path in preset.read_only:
        out += ["--ro-bind-try", path, path]
    if private:
        out += ["--ro-bind", private, private]
    out += ["--bind", workspace, workspace]
    if under(home_dir, (workspace,)):
        # A HOME inside the workspace would be the workspace's own directory once it is bound,
        # shared by every child (issue 33: one planted a settings hook that read its siblings'
        # run tokens): the child's private HOME goes on top of it again.
        out += ["--bind", home.path, home_dir]
    out += ["--chdir", cwd, "--"]
    return out


def bridge_argv(
    socket_name: str, bridge_name: str, proxy_port: int, ports: Iterable[int]
) -> list[str]:
    """What runs first in a proxied sandbox: the bridge, which then becomes the agent. Both
    names are of files in the proxy's directory, seen at :data:`EGRESS_DIR`."""
    listen = ",".join(str(p) for p in ports)
    socket_path, bridge = f"{EGRESS_DIR}/{socket_name}", f"{EGRESS_DIR}/{bridge_name}"
    return [BRIDGE_PYTHON, "-I", "-S", bridge, socket_path, str(proxy_port), listen, "--"]


def unsandboxed_warning(preset: AgentPreset) -> str:
    """What an agent of a ``"sandbox": "none"`` preset can read, said once at start."""
    who = preset.user or pwd.getpwuid(os.geteuid()).pw_name
    if not preset.user and os.geteuid() == 0:
        reach = (
            "everything root can: every file on this machine (the server's database and "
            "SECRET_KEY included), every process's environment and memory, and the MCP "
            "configuration (run tokens) of every other child"
        )
    else:
        reach = (
            f"every file account {who!r} can read, the environment, argv and memory of every "
            f"process of {who!r}, and the MCP configuration (run tokens) of every other child "
            f"running as {who!r}"
        )
    return (
        f"preset {preset.name!r} runs its agent without a sandbox, as {who!r}: it can read {reach}"
    )


# --- no setuid or setgid files --------------------------------------------------------------
# A root runner's agent owns what it writes as host root: without this filter it could leave a
# setuid-root program in the workspace for any local user to run. The filter (seccomp, given
# to bwrap) refuses every mode change or file creation with S_ISUID/S_ISGID (EPERM), the calls
# whose mode it cannot see (openat2, io_uring) and every call of another ABI (ENOSYS).

_SETID = 0o6000
_ARCHES = {
    # arch: (AUDIT_ARCH, {syscall: index of its mode argument}, syscalls refused outright)
    "x86_64": (
        0xC000003E,
        {90: 1, 91: 1, 268: 2, 452: 2, 2: 2, 257: 3, 85: 1, 133: 1, 259: 2},
        (437, 425),
    ),
    "aarch64": (0xC00000B7, {52: 1, 53: 2, 452: 2, 56: 3, 33: 2}, (437, 425)),
}


def _filter(arch: int, modes: dict[int, int], refused: tuple[int, ...]) -> bytes:
    import struct

    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    ld, jeq, jge, and_, ret = 0x20, 0x15, 0x35, 0x54, 0x06
    # Each check is "load the mode argument, keep its set-id bits, allow if none": three
    # instructions after the dispatch; offsets are counted from the next instruction.
    checks = sorted(modes.items())
    head = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, enosys), (ld, 0, 0, 0)]
    head += [(jge, 0, 1, 0x40000000), (ret, 0, 0, enosys)]  # x32 calls
    for nr in refused:
        head += [(jeq, 0, 1, nr), (ret, 0, 0, enosys)]
    dispatch = []
    for i, (nr, _arg) in enumerate(checks):
        # jump to check i: past the rest of the dispatch (len(checks) - i - 1), the allow,
        # and the 3 * i instructions of the checks before it.
        dispatch.append((jeq, (len(checks) - i - 1) + 1 + 3 * i, 0, nr))
    body = [(ret, 0, 0, allow)]
    for _nr, arg in checks:
        body += [(ld, 0, 0, 16 + 8 * arg), (and_, 0, 0, _SETID), (jeq, 0, 0, 0)]
    # Each check ends in "jeq 0 -> allow else eperm": two returns after all checks.
    program = head + dispatch + body
    tail_allow, tail_eperm = len(program), len(program) + 1
    fixed = []
    for index, (code, jt, jf, k) in enumerate(program):
        if code == jeq and k == 0 and index >= len(head) + len(dispatch):
            jt, jf = tail_allow - index - 1, tail_eperm - index - 1
        fixed.append((code, jt, jf, k))
    fixed += [(ret, 0, 0, allow), (ret, 0, 0, eperm)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in fixed)


@functools.cache
def setid_filter() -> bytes | None:
    """The seccomp program for this machine's architecture, or None (then unfiltered)."""
    spec = _ARCHES.get(os.uname().machine)
    return _filter(*spec) if spec else None


def setid_filter_fd() -> int | None:
    """A file descriptor holding :func:`setid_filter` for one bwrap (the caller closes it)."""
    program = setid_filter()
    if program is None:
        machine = os.uname().machine
        log.warning("no set-id filter for %s: sandboxed agents may create setuid files", machine)
        return None
    fd = os.memfd_create("canopy-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd

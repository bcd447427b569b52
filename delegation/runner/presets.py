"""What both agent engines (``command``, ``acp``) read from a presets file the same way.

A presets file is ``{"presets": [...], "workspace"?: ..., "extensionId"?: ...}``. Each preset
shares the fields of :class:`AgentPreset` (name, command line, system prompt, options, env,
default cwd, cancel grace, containment: ``sandbox``, ``readOnly``, ``user``); an engine adds
its own fields on a subclass and reads them with :func:`check_fields` first. A child's cwd is
always :func:`confine`-d to the engine's workspace.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import shlex
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delegation import errors as codes
from delegation.client import Preset, RpcError
from delegation.runner.egress_rules import Grant, check_allow_hosts, split_host_port
from delegation.runner.kodelet.spec import ExtensionSpec, check_extensions
from delegation.runner.sandbox import unsandboxed_warning
from delegation.runner.sandbox_masks import start_mask_thread

log = logging.getLogger("canopy.runner")

# "bwrap" (the default): the agent is contained (delegation/runner/sandbox.py); "none": it runs
# as the runner's (or the preset's) account with everything that account can read.
SANDBOXES = ("bwrap", "none")
# A sandbox's network (SPEC §13): "proxy" (the default) its own namespace and the runner's
# egress proxy (delegation/runner/egress.py); "none" its own namespace and nothing; "host" the
# runner's network, every service on the machine included (said at start).
NETWORKS = ("proxy", "none", "host")
COMMON_FIELDS = frozenset(
    {
        "name",
        "command",
        "systemPrompt",
        "options",
        "env",
        "cwd",
        "cancelGraceSeconds",
        "sandbox",
        "readOnly",
        "user",
        "network",
        "allowHosts",
        "approvals",
        "extensions",
    }
)


@dataclass
class AgentPreset:
    name: str
    command: list[str]
    system_prompt: str = ""
    options: Mapping[str, Any] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None  # default working directory, relative to the workspace
    cancel_grace: float = 5.0  # seconds between SIGTERM and SIGKILL
    sandbox: str = "bwrap"  # contained by default; "none" only when the preset says so
    read_only: tuple[str, ...] = ()  # more paths a sandboxed agent may read (an interpreter)
    user: str | None = None  # run the agent as this account (the runner must be root)
    network: str = "proxy"  # a sandbox's network: NETWORKS ("host" without a sandbox)
    allow_hosts: tuple[str, ...] = ()  # what the egress proxy lets through besides /mcp
    # SPEC §11: the approval policy {rules, default} every run of this preset starts with
    # (sent when the runner registers; the server applies the strictest along the chain).
    approvals: Mapping[str, Any] | None = None
    # SPEC §15: the kodelet extensions each run of this preset hosts (runner/kodelet/).
    extensions: tuple[ExtensionSpec, ...] = ()

    def __post_init__(self):
        if self.sandbox == "none":
            self.network = "host"  # nothing to contain it in: said by unsandboxed_warning

    @property
    def sandboxed(self) -> bool:
        return self.sandbox != "none"

    @property
    def proxied(self) -> bool:
        return self.sandboxed and self.network == "proxy"


def check_fields(raw: Mapping[str, Any], *, label: str, extra: Iterable[str] = ()) -> dict:
    """The shared fields of one preset as :class:`AgentPreset` keyword arguments.

    ``label`` starts every message (``"preset"``, ``"acp preset"``); ``extra`` are the
    engine's own field names, which the engine reads itself. Anything else is refused.
    """
    unknown = set(raw) - COMMON_FIELDS - set(extra)
    if unknown:
        raise ValueError(f"{label}: unknown field(s) {', '.join(sorted(unknown))}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{label}: 'name' must be a non-blank string")
    label = f"{label} {name!r}"
    command = raw.get("command")
    if isinstance(command, str):
        command = shlex.split(command)
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise ValueError(f"{label}: 'command' must be a non-empty list of strings")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError(f"{label}: 'env' must map names to strings")
    grace = raw.get("cancelGraceSeconds", 5.0)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
        raise ValueError(f"{label}: 'cancelGraceSeconds' must be a number >= 0")
    sandbox = raw.get("sandbox", "bwrap")
    if sandbox not in SANDBOXES:
        raise ValueError(f"{label}: 'sandbox' must be one of {', '.join(SANDBOXES)}")
    network = raw.get("network", "proxy" if sandbox != "none" else "host")
    if network not in NETWORKS:
        raise ValueError(f"{label}: 'network' must be one of {', '.join(NETWORKS)}")
    if network != "host" and sandbox == "none":
        raise ValueError(f"{label}: 'network' {network!r} needs a sandbox")
    allow_hosts = check_allow_hosts(raw.get("allowHosts"), label=label)
    if allow_hosts and network != "proxy":
        raise ValueError(
            f"{label}: 'allowHosts' is what the proxy lets through: it needs "
            f'"network": "proxy" (this preset\'s is {network!r})'
        )
    read_only = raw.get("readOnly", [])
    if not isinstance(read_only, list) or not all(
        isinstance(p, str) and os.path.isabs(p) for p in read_only
    ):
        raise ValueError(f"{label}: 'readOnly' must be a list of absolute paths")
    user = raw.get("user")
    if user is not None:
        if not isinstance(user, str) or not user:
            raise ValueError(f"{label}: 'user' must be an account name")
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"{label}: 'user' {user!r} is no account here") from None
    return {
        "name": name,
        "approvals": check_approvals(raw.get("approvals"), label=label),
        "command": command,
        "system_prompt": raw.get("systemPrompt", "") or "",
        "options": raw.get("options"),
        "env": env,
        "cwd": raw.get("cwd"),
        "cancel_grace": float(grace),
        "sandbox": sandbox,
        "read_only": tuple(read_only),
        "user": user,
        "network": network,
        "allow_hosts": allow_hosts,
        "extensions": check_extensions(raw.get("extensions"), label=label),
    }


def check_approvals(raw, *, label: str) -> dict | None:
    """A preset's ``approvals`` (a policy, or a shipped policy's name) in the one strict
    policy shape the server checks too, so a bad one is refused when the file loads rather
    than when the runner registers."""
    if raw is None:
        return None
    # Imported here: an agent host imports the runner without pydantic (the SDK's promise),
    # and only a preset that carries a policy needs the schema.
    from pydantic import ValidationError

    from delegation.wire.approvals import SHIPPED_POLICIES, Policy

    if isinstance(raw, str):
        if raw not in SHIPPED_POLICIES:
            raise ValueError(
                f"{label}: 'approvals' names no shipped policy {raw!r} "
                f"(shipped: {', '.join(sorted(SHIPPED_POLICIES))}; or give {{rules, default}})"
            )
        raw = SHIPPED_POLICIES[raw]
    try:
        return Policy.model_validate(raw).plain()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(policy)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ValueError(
            f"{label}: 'approvals' is not a policy {{rules, default}}: {problems}"
        ) from None


def by_name(presets: list[AgentPreset], engine: str) -> dict[str, AgentPreset]:
    if not presets:
        raise ValueError(f"the {engine} engine needs at least one preset")
    names = [p.name for p in presets]
    if len(set(names)) != len(names):
        raise ValueError("duplicate preset names")
    return {p.name: p for p in presets}


def load_config(path: str | os.PathLike) -> dict:
    """Read a presets file: ``{"presets": [...], "workspace"?: ..., "extensionId"?: ...}``."""
    with open(path, encoding="utf-8") as fh:
        raw = json.load(fh)
    if isinstance(raw, list):
        raw = {"presets": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("presets"), list):
        raise ValueError(f"{path}: expected an object with a 'presets' list")
    unknown = set(raw) - {"presets", "workspace", "extensionId"}
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")
    # Relative program paths ("./agents/review.sh") and a relative workspace are relative to
    # the file, not to wherever the runner happens to be started.
    base = Path(path).resolve().parent
    for preset in raw["presets"]:
        command = preset.get("command") if isinstance(preset, dict) else None
        if isinstance(command, str):
            command = preset["command"] = shlex.split(command)
        if isinstance(command, list) and command and isinstance(command[0], str):
            program = command[0]
            if "/" in program and not os.path.isabs(program):
                command[0] = str(base / program)
    if isinstance(raw.get("workspace"), str) and not os.path.isabs(raw["workspace"]):
        raw["workspace"] = str(base / raw["workspace"])
    return raw


_URL = re.compile(r"\bhttps?://[^\s\"'/,;]+")


def unreachable_urls(preset: AgentPreset) -> list[str]:
    """The URLs in a proxied preset's env and command line (its model endpoint, most often)
    that its ``allowHosts`` does not cover: said at start, since the agent would only see a
    connection refused."""
    grants = [Grant.parse(entry) for entry in preset.allow_hosts]
    out = []
    for text in (*preset.env.values(), *preset.command):
        for url in _URL.findall(text):
            scheme, _, rest = url.partition("://")
            try:
                host, port = split_host_port(rest, default=443 if scheme == "https" else 80)
            except ValueError:
                continue
            host = host.lower()
            if not any(g.matches(host, port) for g in grants) and url not in out:
                out.append(url)
    return out


def server_paths() -> dict[str, str]:
    """What an agent's workspace must neither contain nor lie inside (SPEC §13), by name:
    this installation of Canopy (a checkout, or the package), its virtual environment and
    its data directory (canopy/settings.py's ``DATA_DIR``, worked out the same way: the
    runner does not load Django)."""
    package = Path(__file__).resolve().parents[1]
    checkout = package.parent
    out = {"Canopy's installation": str(package)}
    if (checkout / "manage.py").exists():
        out["Canopy's checkout"] = str(checkout)
        data = checkout / "var"
    else:
        xdg = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
        data = Path(xdg) / "canopy"
    out["Canopy's data directory"] = os.environ.get("CANOPY_DATA_DIR") or str(data)
    if sys.prefix != sys.base_prefix:
        out["the virtual environment"] = sys.prefix
    return {name: os.path.realpath(path) for name, path in out.items()}


def check_workspace(workspace: str, presets: Iterable[AgentPreset]) -> None:
    """ValueError, naming the presets, if ``workspace`` holds or lies in :func:`server_paths`:
    an agent there reads the server's secrets and database, and writes its code."""
    real = os.path.realpath(workspace)
    for name, path in server_paths().items():
        if real == path or _inside(real, path) or _inside(path, real):
            where = "is" if real == path else ("lies inside" if _inside(real, path) else "holds")
            names = ", ".join(repr(p.name) for p in presets)
            raise ValueError(
                f"preset(s) {names}: the workspace {workspace!r} {where} {name} ({path}): an "
                "agent there could read the server's secrets and change its code; give the "
                'runner a workspace of its own (--workspace, or "workspace" in the presets file)'
            )


def _inside(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def confine(workspace: str, cwd: str | None) -> str:
    """``cwd`` resolved inside ``workspace`` (after symlinks); ValueError if it escapes."""
    base = Path(workspace).resolve()
    target = (base / cwd).resolve() if cwd else base
    if target != base and base not in target.parents:
        raise ValueError(f"cwd {cwd!r} resolves outside the workspace {str(base)!r}")
    if not target.is_dir():
        raise ValueError(f"cwd {cwd!r} is not a directory inside the workspace")
    return str(target)


class PresetEngine:
    """What the ``command`` and ``acp`` engines share about their presets: the list the runner
    registers, the check before a child starts, and the preset a run uses."""

    name = ""
    preset_class: type[AgentPreset] = AgentPreset
    missing = "has no agent here"  # how check() says a preset is not on this runner

    def __init__(self, presets: list, workspace: str, *, mcp=None):
        self.presets_by_name = by_name(presets, self.name)
        self.workspace = str(Path(workspace).resolve())
        check_workspace(self.workspace, presets)
        self.mcp = mcp
        contained = [p.name for p in presets if p.sandboxed]
        if contained and not shutil.which("bwrap"):
            raise ValueError(
                f"preset(s) {', '.join(contained)}: agents run in a bubblewrap sandbox and "
                "bwrap is not installed (apt-get install bubblewrap); a preset that must run "
                'unsandboxed says "sandbox": "none"'
            )
        for preset in presets:
            if not preset.sandboxed:
                log.warning("%s", unsandboxed_warning(preset))
            elif preset.proxied:
                for url in unreachable_urls(preset):
                    log.warning(
                        "preset %r names %s, which its allowHosts does not list: the egress "
                        "proxy will refuse its agent that address (add %r to allowHosts)",
                        preset.name,
                        url,
                        url.split("://", 1)[1].split("/", 1)[0],
                    )
            elif preset.network == "host":
                log.warning(
                    "preset %r shares the runner's network: its agent reaches every service on "
                    "this machine (the database, Redis, the server's port) and everything the "
                    'machine reaches; "network": "proxy" (the default) lets through only its '
                    "model and /mcp",
                    preset.name,
                )
        if os.geteuid() == 0 and any(p.sandboxed and not p.user for p in presets):
            # The first root sandbox masks what only root may read in the system paths: found
            # by one thread per process (seconds on a cold disk), then kept current by it.
            start_mask_thread()

    @classmethod
    def from_config(cls, config: Mapping[str, Any], workspace: str | None = None, **kwargs):
        presets = [cls.preset_class.from_config(p) for p in config["presets"]]
        return cls(presets, workspace or config.get("workspace") or os.getcwd(), **kwargs)

    def presets(self) -> list[Preset]:
        return [
            Preset(
                p.name,
                p.system_prompt,
                dict(p.options) if p.options else None,
                approvals=dict(p.approvals) if p.approvals is not None else None,
                can_fork=self.can_fork(p),
            )
            for p in self.presets_by_name.values()
        ]

    def can_fork(self, preset: AgentPreset) -> bool:
        """SPEC §14: whether a child of this preset can start as a fork of its parent's agent
        conversation; the server refuses ``contextMode: "fork"`` for a preset that cannot."""
        return False

    def check(self, command, host) -> None:
        preset = self.presets_by_name.get(command.preset.name)
        if preset is None:
            raise RpcError(codes.INVALID_PARAMS, f"preset {command.preset.name!r} {self.missing}")
        try:
            confine(self.workspace, command.request.get("cwd") or preset.cwd)
        except ValueError as exc:
            raise RpcError(codes.INVALID_PARAMS, f"request.cwd: {exc}") from None

    def preset_of(self, ctx) -> AgentPreset:
        return self.presets_by_name[ctx.preset.name if ctx.preset else ctx.profile]

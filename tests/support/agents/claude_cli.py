"""Finding and running the Claude Code CLI that ``make agents`` installs into the project.

Tests must fail, not skip, when the CLI is missing: CI installs it, so its absence is a broken
environment, and a skip would hide that the real-agent tests never ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[3]
INSTALLED = PROJECT / ".agents" / "node_modules" / ".bin"


def claude_bin() -> str:
    """The ``claude`` executable: ``CLAUDE_BIN`` if set, else the project's installed one."""
    path = Path(os.environ.get("CLAUDE_BIN") or INSTALLED / "claude")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(
            f"Claude Code CLI not found at {path}: run `make agents` (or set CLAUDE_BIN)"
        )
    return str(path)


def acp_bin() -> str:
    """The ``claude-agent-acp`` adapter (successor of ``claude-code-acp``): ``CLAUDE_ACP_BIN``
    if set, else the one ``make agents`` installs."""
    path = Path(os.environ.get("CLAUDE_ACP_BIN") or INSTALLED / "claude-agent-acp")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(
            f"claude-agent-acp not found at {path}: run `make agents` (or set CLAUDE_ACP_BIN)"
        )
    return str(path)


def allow_model(model_url: str) -> list[str]:
    """The ``allowHosts`` that lets a sandboxed agent reach the stub model (SPEC §13: a
    loopback address only when the preset names it with its port)."""
    host_port = model_url.split("://", 1)[1].split("/", 1)[0]
    return [host_port]


def offline_env(model_url: str, home: Path, **extra: str) -> dict[str, str]:
    """An environment that keeps the CLI on the stub model and off the machine's config.

    ``HOME`` (and the XDG dirs) point at a private directory so no user settings, credentials
    or MCP servers leak in; ``ENABLE_TOOL_SEARCH=false`` keeps MCP tools offered to the model
    directly instead of deferred behind a search tool.
    """
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "TMPDIR": str(home / "tmp"),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "sk-ant-stub-not-a-key",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "ENABLE_TOOL_SEARCH": "false",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        **extra,
    }
    (home / "tmp").mkdir(exist_ok=True)
    return env


@dataclass
class ClaudeRun:
    returncode: int
    records: list[dict[str, Any]]
    lines: list[str]
    stderr: str
    seconds: float

    def of_type(self, kind: str, subtype: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.records
            if r.get("type") == kind and (subtype is None or r.get("subtype") == subtype)
        ]

    def content_blocks(self, role: str, kind: str) -> list[dict[str, Any]]:
        """Blocks of type ``kind`` inside the ``assistant``/``user`` records."""
        return [
            block
            for r in self.of_type(role)
            for block in (r.get("message") or {}).get("content") or []
            if isinstance(block, dict) and block.get("type") == kind
        ]

    @property
    def result(self) -> dict[str, Any]:
        results = self.of_type("result")
        assert results, f"no result record; stderr: {self.stderr[-2000:]}"
        return results[-1]


def run_claude(
    prompt: str,
    *,
    model_url: str,
    home: Path,
    mcp_servers: dict[str, Any] | None = None,
    allowed_tools: list[str] = (),
    extra_args: list[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 90,
) -> ClaudeRun:
    """``claude -p PROMPT --output-format stream-json --verbose`` against the stub model."""
    args = [claude_bin(), "-p", prompt, "--output-format", "stream-json", "--verbose"]
    if mcp_servers is not None:
        config = home / "mcp.json"
        home.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps({"mcpServers": mcp_servers}))
        args += ["--mcp-config", str(config), "--strict-mcp-config"]
    if allowed_tools:
        args += ["--allowedTools", ",".join(allowed_tools)]
    args += list(extra_args)
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = subprocess.run(
        args,
        cwd=work,
        env=offline_env(model_url, home, **(env or {})),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.monotonic() - started
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            records.append({"type": "<unparsed>", "line": line})
    return ClaudeRun(proc.returncode, records, lines, proc.stderr, seconds)

"""The other pinned agent CLIs ``make agents`` installs (Codex, Gemini CLI, Copilot CLI), and
the environments that keep each one offline on its scripted model endpoint.

Like :mod:`tests.support.agents.claude_cli`, a missing CLI fails the test (CI installs them).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.agents.claude_cli import INSTALLED

# A key the stubs accept. Long and unlike any word: Copilot CLI masks the provider key's value
# wherever it appears in its output, so a short one would garble ordinary text.
STUB_KEY = "sk-stub-offline-0000000000"
COPILOT_MODEL = "claude-sonnet-4.5"


def agent_bin(name: str) -> str:
    """``<NAME>_BIN`` if set, else the project's installed ``name`` (codex, gemini, copilot)."""
    path = Path(os.environ.get(f"{name.upper()}_BIN") or INSTALLED / name)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(f"{name} CLI not found at {path}: run `make agents`")
    return str(path)


def private_home(home: Path) -> dict[str, str]:
    """HOME, XDG dirs and TMPDIR inside ``home``: no machine config or credentials leak in."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "tmp").mkdir(exist_ok=True)
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "TMPDIR": str(home / "tmp"),
        "LANG": "C.UTF-8",
    }


def copilot_env(model_url: str) -> dict[str, str]:
    """Copilot CLI on a scripted Anthropic Messages endpoint, with no GitHub sign-in."""
    return {
        "COPILOT_OFFLINE": "true",
        "COPILOT_PROVIDER_TYPE": "anthropic",
        "COPILOT_PROVIDER_BASE_URL": model_url,
        "COPILOT_PROVIDER_API_KEY": STUB_KEY,
        "COPILOT_MODEL": COPILOT_MODEL,
    }


@dataclass
class CliRun:
    returncode: int
    lines: list[str]
    stderr: str
    seconds: float


def run_cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> CliRun:
    cwd.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = subprocess.run(
        args,
        cwd=cwd,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return CliRun(proc.returncode, lines, proc.stderr, time.monotonic() - started)


CODEX_MODEL = "gpt-5.1-codex"


def codex_provider_args(model_url: str) -> list[str]:
    """``-c`` overrides that point Codex at the scripted Responses endpoint (nothing secret:
    the key is read from ``STUB_API_KEY``): SSE only, no WebSocket first."""
    provider = (
        '{name="stub", base_url="' + model_url + '/v1", env_key="STUB_API_KEY", '
        'wire_api="responses", supports_websockets=false}'
    )
    return [
        "-c",
        f'model="{CODEX_MODEL}"',
        "-c",
        'model_provider="stub"',
        "-c",
        f"model_providers.stub={provider}",
    ]


GEMINI_MODEL = "gemini-2.5-flash"


def gemini_env(model_url: str) -> dict[str, str]:
    """Gemini CLI on the scripted Gemini endpoint, API-key auth, no relaunch."""
    return {
        "GOOGLE_GEMINI_BASE_URL": model_url,
        "GEMINI_API_KEY": STUB_KEY,
        "GEMINI_CLI_NO_RELAUNCH": "true",
    }

"""Canopy's MCP server for one child: its run token, and the per-child configuration file.

A runner asks the server for a run token per child (``run.mcpToken``, SPEC §9) and hands it to
the agent only inside the agent's MCP configuration: a header in a file only the agent may read
(the ``command`` engine's ``{mcpConfig}``), or the ``mcpServers`` of an ACP ``session/new``.
The token acts as the run, so it is never put on argv, in an event or in a log.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from delegation import depth as depthlib
from delegation.client import McpToken

SERVER_NAME = "canopy"
FILE_NAME = "mcp.json"

# Tests (and hosts with their own token source) may replace how a run's token is obtained.
McpProvider = Callable[[Any], Awaitable[McpToken | Mapping[str, str] | None]]


async def run_token(ctx) -> McpToken:
    """The run token of ``ctx``'s run, from the server the runner is connected to."""
    return await ctx.client.mcp_token(ctx.run_id)


def as_token(found: McpToken | Mapping[str, str]) -> McpToken:
    if isinstance(found, McpToken):
        return found
    return McpToken(url=found["url"], token=found["token"], expires_at=found.get("expiresAt", ""))


# Every run token this runner has handed to a running child: an agent that found a sibling's
# token (or its own, in a debug dump) must not put it into an event, an output or a log.
LIVE_TOKENS: set[str] = set()
REDACTED = "[run token]"


def redact(text: str, secret: str | None = None) -> str:
    """``text`` with every live run token (and ``secret``) replaced."""
    for token in (secret, *LIVE_TOKENS) if secret else LIVE_TOKENS:
        if token and token in text:
            text = text.replace(token, REDACTED)
    return text


def redact_value(value: Any) -> Any:
    """``value`` (an event, or any part of one) with every live run token replaced."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    return value


def redact_outcome(outcome):
    """A run's :class:`~delegation.runner.host.Outcome` with every live run token replaced."""
    if outcome.output:
        outcome.output = redact(outcome.output)
    if outcome.error:
        outcome.error = redact(outcome.error)
    return outcome


def headers(token: McpToken, level: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {token.token}", depthlib.HEADER: str(level)}


# How each CLI names a streamable-HTTP server in its ``mcpServers``: Claude Code (and Copilot
# CLI) read ``type: http`` + ``url``; Gemini CLI reads ``httpUrl`` (its ``url`` means SSE);
# Codex reads ``[mcp_servers.canopy]`` from ``$CODEX_HOME/config.toml``, where a plain
# ``headers`` key is ignored: the token comes from the variable ``bearer_token_env_var`` names.
SHAPES = ("claude", "gemini", "codex")
CODEX_TOKEN_ENV = "CANOPY_RUN_TOKEN"
CODEX_FILE = "config.toml"
GEMINI_FILE = "settings.json"


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def codex_config(token: McpToken, level: int) -> str:
    """The ``config.toml`` of a Codex child: Canopy's server, the token by environment."""
    return (
        f"[mcp_servers.{SERVER_NAME}]\n"
        f"url = {_toml_string(token.url)}\n"
        f"bearer_token_env_var = {_toml_string(CODEX_TOKEN_ENV)}\n"
        f"http_headers = {{ {_toml_string(depthlib.HEADER)} = {_toml_string(str(level))} }}\n"
    )


def servers_config(token: McpToken, level: int, shape: str = "claude") -> dict:
    """The ``{"mcpServers": ...}`` document the agent reads: Canopy's server over streamable
    HTTP, as this child at ``level``."""
    if shape == "gemini":
        entry = {"httpUrl": token.url, "headers": headers(token, level)}
        # Gemini CLI 0.61 ignores a settings file under a world-writable directory (/tmp)
        # and, in a folder it does not trust, overrides --yolo: the file goes in the child's
        # private HOME (~/.gemini/settings.json), and the sandbox is the trust boundary.
        return {
            "mcpServers": {SERVER_NAME: entry},
            "security": {
                "folderTrust": {"enabled": False},
                "auth": {"selectedType": "gemini-api-key"},
            },
        }
    else:
        entry = {"type": "http", "url": token.url, "headers": headers(token, level)}
    return {"mcpServers": {SERVER_NAME: entry}}


class McpConfigFile:
    """A private directory holding one ``mcp.json`` (mode 0600), removed by :meth:`remove`.

    With ``user`` (the agent runs as another account) the directory and file are handed to
    that account, so the agent can read them and no one else but root can.
    """

    def __init__(
        self,
        token: McpToken,
        level: int,
        *,
        user: str | None = None,
        shape: str = "claude",
        directory: str | None = None,
    ):
        # ``directory``: write into that (private) directory instead of a new one, and leave
        # the directory itself to its owner (a Codex child's CODEX_HOME inside its HOME).
        self.owned = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="canopy-mcp-")  # mode 0700
        name = {"codex": CODEX_FILE, "gemini": GEMINI_FILE}.get(shape, FILE_NAME)
        self.path = os.path.join(self.directory, name if directory else FILE_NAME)
        if shape == "codex":
            self.path = os.path.join(self.directory, CODEX_FILE)
        try:
            if shape == "codex":
                body = codex_config(token, level).encode("utf-8")
            else:
                body = json.dumps(servers_config(token, level, shape), indent=2).encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(body)
            if user:
                account = pwd.getpwnam(user)
                os.chown(self.directory, account.pw_uid, account.pw_gid)
                os.chown(self.path, account.pw_uid, account.pw_gid)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if self.owned:
                shutil.rmtree(self.directory)
            else:
                os.unlink(self.path)

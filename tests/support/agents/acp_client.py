"""A minimal Agent Client Protocol client over stdio, for driving ``claude-code-acp`` in tests.

ACP is newline-delimited JSON-RPC 2.0. The client answers the agent's permission requests with
``allow_once`` (or rejects them) and keeps every ``session/update`` for assertions.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.agents.claude_cli import acp_bin, claude_bin, offline_env


class ACPAgent:
    """``node claude-code-acp`` in its own process group, against the scripted model."""

    def __init__(self, model_url: str, home: Path, *, pinned_cli: bool = True, allow: bool = True):
        extra = {"CLAUDE_CODE_EXECUTABLE": claude_bin()} if pinned_cli else {}
        self.home = home
        self.cwd = home / "work"
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.allow = allow
        self.updates: list[dict[str, Any]] = []
        self.permission_requests: list[dict[str, Any]] = []
        self._next_id = 1
        self._stderr = open(home / "acp-stderr.txt", "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            ["node", acp_bin()],
            cwd=self.cwd,
            env=offline_env(model_url, home, **extra),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        # A reader thread, not select() on the pipe: a buffered readline can pull two messages
        # off the pipe at once, and select() would then wait for data that is already read.
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _send(self, message: dict[str, Any]) -> None:
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any], timeout: float = 60) -> Any:
        """Send a request and serve the agent's own requests until its answer arrives."""
        request_id = self._next_id
        self._next_id += 1
        self._send({"id": request_id, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=5)
                raise RuntimeError(f"ACP agent exited {self.proc.returncode}: {self.stderr}")
            if not line.strip():
                continue
            message = json.loads(line)
            if message.get("method") == "session/update":
                self.updates.append(message["params"]["update"])
            elif message.get("method") == "session/request_permission":
                self.permission_requests.append(message["params"])
                kind = "allow_once" if self.allow else "reject_once"
                option = next(o for o in message["params"]["options"] if o["kind"] == kind)
                outcome = {"outcome": "selected", "optionId": option["optionId"]}
                self._send({"id": message["id"], "result": {"outcome": outcome}})
            elif message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"ACP {method} failed: {message['error']}")
                return message["result"]
        raise TimeoutError(f"no answer to ACP {method} within {timeout} s")

    @property
    def stderr(self) -> str:
        self._stderr.flush()
        return (self.home / "acp-stderr.txt").read_text()[-3000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                # The adapter's own children (the CLI) share its process group.
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> ACPAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

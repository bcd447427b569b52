"""A toy MCP server over streamable HTTP (official ``mcp`` package), run in a thread for tests.

Tools: ``echo`` returns its text and records every call; ``fail`` always raises, which the SDK
turns into an ``isError`` result, so an agent's handling of a failed tool can be observed.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError


class ToyMCP:
    """Serves ``/mcp`` on 127.0.0.1 and a free port; use as a context manager."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        server = MCPServer("toy")

        @server.tool(description="Echo the given text back, prefixed with 'echo: '.")
        def echo(text: str) -> str:
            self.calls.append(("echo", {"text": text}))
            return f"echo: {text}"

        @server.tool(
            description="Always fails (an isError result); for testing how an agent sees a tool error."
        )
        def fail(reason: str) -> str:
            self.calls.append(("fail", {"reason": reason}))
            raise ToolError(f"toy failure: {reason}")

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(
            server.streamable_http_app(), log_level="warning", lifespan="on", ws="none"
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._uvicorn.serve(sockets=[self._sock])), daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()
        return f"http://{host}:{port}/mcp"

    def __enter__(self) -> ToyMCP:
        self._thread.start()
        deadline = 100
        while not self._uvicorn.started and deadline:
            threading.Event().wait(0.05)
            deadline -= 1
        if not self._uvicorn.started:
            raise RuntimeError("toy MCP server did not start within 5 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

"""A minimal JSON-RPC runner over a real WebSocket: enough to load the server, nothing of the
SDK's logic."""

from __future__ import annotations

import itertools
import json

import websockets

TEXT = "hello world " * 4


class Runner:
    """A minimal JSON-RPC runner: enough to load the server, nothing of the SDK's logic."""

    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)

    @classmethod
    async def connect(cls, url: str, token: str):
        ws = await websockets.connect(
            f"{url}/ws/runner/",
            additional_headers={"Authorization": f"Bearer {token}"},
            max_size=2**24,
        )
        return cls(ws)

    async def call(self, method: str, params: dict) -> dict:
        rpc_id = next(self.ids)
        await self.ws.send(
            json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
        )
        while True:
            frame = json.loads(await self.ws.recv())
            if "method" in frame:  # a server command: accept it
                await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": frame["id"], "result": {}}))
                continue
            if frame.get("id") == rpc_id:
                if "error" in frame:
                    raise RuntimeError(f"{method}: {frame['error']}")
                return frame["result"]

    async def register(self, extensions=()):
        return await self.call(
            "runner.register", {"hostInstanceId": "bench", "extensions": list(extensions)}
        )

"""Helpers for the dashboard's browser tests: a scripted runner on a real WebSocket, personas,
and Playwright driving Debian's chromium (never a downloaded browser build).

``ScriptedRunner`` speaks the runner protocol (SPEC §5) over a real socket from a thread of its
own, so a synchronous Playwright test can tell it step by step what to emit while the page
watches. It answers the server's commands the way a well-behaved runner does: ``child.execute``
is accepted and the child says it started, ``run.steer`` is injected and the run replies to it,
``run.cancel`` finishes the run with ``cancelled: true``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
from websockets.asyncio.client import connect


def find_chromium() -> str | None:
    """Debian's chromium: ``CHROMIUM`` if set, else ``chromium`` (or ``chromium-browser``) on
    ``PATH``. Never a browser build Playwright downloads."""
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


CHROMIUM = find_chromium()
# Browser tests skip without it for a newcomer; CANOPY_NO_SKIPS (CI) turns that into a failure.
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (on PATH, or set CHROMIUM=/path/to/it)"
)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
RESULTS = Path(__file__).resolve().parents[2] / "test-results"
EXTENSION = {
    "extensionId": "ext",
    "generation": 1,
    "presets": [
        {"name": "worker", "systemPrompt": "You work."},
        {"name": "reviewer", "systemPrompt": "You review."},
    ],
}


class RunnerError(Exception):
    def __init__(self, error: dict):
        super().__init__(error.get("message", error))
        self.error = error


class ScriptedRunner:
    def __init__(self, url: str, token: str, host: str = "host-1"):
        self.url = url
        self.token = token
        self.host = host
        self.ids = itertools.count(1)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.pending: dict[int, asyncio.Future] = {}
        self.emitted: dict[str, int] = {}
        self.commands: list[dict] = []
        self.steers: list[dict] = []
        # What run.steer answers; a test may make the runner refuse steers.
        self.steer_answer = {"outcome": "injected"}
        self.ws = None
        self.reader = None
        self.auto_cancel = True

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> ScriptedRunner:
        self.thread.start()
        self._run(self._connect())
        self.call("runner.register", {"hostInstanceId": self.host, "extensions": [EXTENSION]})
        return self

    def close(self):
        if not self.thread.is_alive():
            return
        try:
            self._run(self._close(), timeout=5)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)

    async def _connect(self):
        self.ws = await connect(
            self.url, additional_headers={"Authorization": f"Bearer {self.token}"}
        )
        self.reader = asyncio.ensure_future(self._read())

    async def _close(self):
        if self.reader:
            self.reader.cancel()
        if self.ws:
            await self.ws.close()

    def _run(self, coro, timeout: float = 15):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # --- frames ---------------------------------------------------------------------------

    async def _read(self):
        async for text in self.ws:
            frame = json.loads(text)
            if "method" in frame:
                # Aside: handling a command makes calls whose answers this loop must read.
                asyncio.ensure_future(self._on_command(frame))
                continue
            future = self.pending.pop(frame.get("id"), None)
            if future is not None and not future.done():
                future.set_result(frame)

    async def _send(self, frame: dict):
        await self.ws.send(json.dumps(frame))

    async def _call(self, method: str, params: dict) -> dict:
        rpc_id = next(self.ids)
        future = self.loop.create_future()
        self.pending[rpc_id] = future
        await self._send({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
        frame = await asyncio.wait_for(future, 15)
        if "error" in frame:
            raise RunnerError(frame["error"])
        return frame["result"]

    def call(self, method: str, params: dict) -> dict:
        return self._run(self._call(method, params))

    async def _on_command(self, frame: dict):
        self.commands.append(frame)
        method, params = frame["method"], frame["params"]
        result = {}
        if method == "run.steer":
            result = dict(self.steer_answer)
        await self._send({"jsonrpc": "2.0", "id": frame["id"], "result": result})
        if method == "child.execute":
            run_id = params["identity"]["runId"]
            await self._emit(
                run_id, [{"kind": "text", "text": "started: " + params["request"]["message"]}]
            )
        elif method == "run.steer" and result["outcome"] == "injected":
            self.steers.append(params)
            await self._emit(
                params["runId"],
                [{"kind": "text", "text": f"Steered: I was told {params['message']!r}"}],
            )
        elif method == "run.cancel" and self.auto_cancel:
            await self._call("run.finish", {"runId": params["runId"], "cancelled": True})

    async def _emit(self, run_id: str, events: list[dict]) -> dict:
        first = self.emitted.get(run_id, 0) + 1
        self.emitted[run_id] = first + len(events) - 1
        return await self._call("run.event", {"runId": run_id, "from": first, "events": events})

    # --- what a test asks for ---------------------------------------------------------------

    def open(self, run_id: str, profile: str = "worker", message: str | None = None) -> dict:
        params = {
            "conversationId": f"conv-{run_id}",
            "runId": run_id,
            "profile": profile,
            "extensionId": "ext",
        }
        if message is not None:  # the task, as ``runner --root MESSAGE`` sends it
            params["message"] = message
        return self.call("run.open", params)

    def emit(self, run_id: str, *events: dict) -> dict:
        return self._run(self._emit(run_id, list(events)))

    def text(self, run_id: str, text: str) -> dict:
        return self.emit(run_id, {"kind": "text", "text": text})

    def child(
        self,
        parent: str,
        request_id: str,
        message: str = "do the thing",
        profile="worker",
        lease_id=None,
    ) -> dict:
        request = {"requestId": request_id, "profile": profile, "message": message}
        params = {"runId": parent, "extensionId": "ext", "generation": 1, "request": request}
        if lease_id:
            request["leaseId"] = lease_id
            params["leaseId"] = lease_id
        return self.call("child.start", params)

    def finish(self, run_id: str, **fields) -> dict:
        return self.call("run.finish", {"runId": run_id, **fields})


# --- Playwright ---------------------------------------------------------------------------------


def launch(playwright):
    assert CHROMIUM, "Debian's chromium is needed (apt-get install chromium, or set CHROMIUM)"
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def sign_in(page, base_url: str, username: str, password: str):
    page.goto(f"{base_url}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("[data-action=sign-in]")
    page.wait_for_url(re.compile(r".*/trees/.*"))  # the overview, or the newest live tree


def screenshot_name(nodeid: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    return RESULTS / (re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid) + ".png")


def sequences(page) -> list[int]:
    return page.eval_on_selector_all(
        "#events [data-sequence]", "els => els.map(e => Number(e.dataset.sequence))"
    )


def wait_status(page, run_id: str, status: str, scope: str = ""):
    page.wait_for_selector(f'{scope} [data-run-id="{run_id}"][data-status="{status}"]')

"""Chromium for the tree measures, and waiting on a page under its CSP."""

from __future__ import annotations

import os
import time


def poll(page, expression: str, timeout: float = 120.0):
    """page.wait_for_function evaluates a string, which the pages' CSP refuses: poll instead."""
    deadline = time.monotonic() + timeout
    while True:
        value = page.evaluate(f"() => {expression}")
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {expression}")
        time.sleep(0.01)


def chromium(playwright):
    return playwright.chromium.launch(
        executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-quic",
        ],
    )

"""Chromium for the tree measures (the suite's: Debian's chromium with the same flags), and
waiting on a page under its CSP."""

from __future__ import annotations

import time

from tests.support.browser import launch as chromium

__all__ = ["chromium", "poll"]


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

"""Runner-side helpers for tests that start the SDK or the reference runner host."""

from __future__ import annotations

import os

# RunnerClient options for tests: reconnect at once and give up on a call well inside a
# test's timeout, rather than the SDK's defaults tuned for real networks.
FAST = {"backoff_initial": 0.05, "backoff_max": 0.5, "call_timeout": 30}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

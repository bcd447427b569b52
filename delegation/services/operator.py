"""Renamed ``run_actions`` (issue 34). Kept only for ``delegation/consumers.py``, which the
runner-socket move (``delegation/runner_socket/``) rewrites in a parallel branch: delete this
file when that lands and its consumer imports ``run_actions``."""

from delegation.services.run_actions import await_release

__all__ = ["await_release"]

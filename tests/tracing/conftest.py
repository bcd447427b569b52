"""The trace tests' session-wide Phoenix (started once, on first use)."""

from tests.support.phoenix import phoenix  # noqa: F401

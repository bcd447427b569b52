"""The trace tests' session-wide Phoenix: started as soon as collection selects a test of
this folder, so its boot overlaps whatever runs first; the fixture waits for it."""

import tempfile
from pathlib import Path

from tests.support import phoenix as phoenix_support
from tests.support.phoenix import phoenix  # noqa: F401

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(session, config, items):
    if any(Path(str(item.path)).resolve().is_relative_to(HERE) for item in items):
        # tmp_path_factory is a fixture, not reachable from a hook: a temp dir of our own.
        phoenix_support.start_early(Path(tempfile.mkdtemp(prefix="canopy-phoenix-")))


def pytest_unconfigure(config):
    phoenix_support.stop()

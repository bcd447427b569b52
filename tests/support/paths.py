"""Where things are, so no module counts ``.parent`` steps from wherever it happens to sit."""

from pathlib import Path

# The checkout the suite runs from: manage.py, README.md, test-results/.
PROJECT = Path(__file__).resolve().parents[2]
# The agent stubs and recordings the tests start or read (tests/support/agents/).
AGENTS = Path(__file__).resolve().parent / "agents"

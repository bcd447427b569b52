"""Issue 34: transports read the database through selectors and write through services. The
pages, the REST API and the live socket (``dashboard/``), the MCP server (``delegation/mcp/``)
and the runner socket package name no model manager themselves: a ``.objects.`` query there
is a read (or a write) that no other door shares."""

from __future__ import annotations

import re

from tests.support.paths import PROJECT

TRANSPORTS = ("dashboard", "delegation/mcp", "delegation/runner_socket")
QUERY = re.compile(r"\bobjects\s*\.")

# "path": "why it must query here". Empty, and it should stay so.
ALLOWED: dict[str, str] = {}


def queries_in_transports() -> dict[str, list[int]]:
    found = {}
    for package in TRANSPORTS:
        for path in (PROJECT / package).rglob("*.py"):
            relative = path.relative_to(PROJECT).as_posix()
            lines = path.read_text(encoding="utf-8").splitlines()
            hits = [n for n, line in enumerate(lines, 1) if QUERY.search(line)]
            if hits and relative not in ALLOWED:
                found[relative] = hits
    return found


def test_it_finds_a_query_where_there_is_one():
    # The pattern itself: a test that greps must be able to see what it looks for.
    assert QUERY.search('Run.objects.filter(run_id="r")')
    assert QUERY.search("get_user_model()\n.objects.filter(pk=1)".replace("\n", ""))
    assert not QUERY.search("selectors.get_run(run_id)")


def test_it_leaves_every_database_read_of_a_transport_to_a_selector():
    found = queries_in_transports()
    assert found == {}, f"move these queries into delegation/selectors (reads) or services: {found}"

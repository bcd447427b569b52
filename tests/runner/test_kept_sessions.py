"""Fork from here's kept transcripts (SPEC §14) without an agent: the runner keeps a finished
run's Claude Code transcript from the agent's HOME, refuses one reached through a link the
agent planted, and resolves a step to the transcript entry to resume at (the real CLI is
tests/agents/test_claude_fork_from_here.py)."""

from __future__ import annotations

import os

import pytest

from delegation.runner import fork, kept_sessions
from delegation.runner.fork import ForkRefused

SESSION = "0b5e7a52-1111-4c2d-9d1e-3f0a6b7c8d9e"


def agent_home(tmp_path, data: bytes = b'{"uuid": "u1"}\n'):
    home = tmp_path / "home"
    project = home / ".claude" / "projects" / "-work"
    project.mkdir(parents=True)
    (project / f"{SESSION}.jsonl").write_bytes(data)
    return home


def test_it_keeps_a_transcript_and_resolves_a_step_to_its_entry(tmp_path):
    store = str(tmp_path / "store")
    home = agent_home(tmp_path)
    assert kept_sessions.keep(store, SESSION, str(home), [(3, "u1"), (7, "u2")])
    assert oct(os.stat(os.path.join(store, f"{SESSION}.jsonl")).st_mode & 0o777) == "0o600"

    fork_from = {"sessionId": SESSION, "runId": "r-1", "runnerIndex": 5, "sequence": 4}
    assert kept_sessions.resolve(store, fork_from) == (SESSION, b'{"uuid": "u1"}\n', "u1")
    at_start = {**fork_from, "runnerIndex": 1}
    with pytest.raises(ForkRefused, match="before the agent's first message"):
        kept_sessions.resolve(store, at_start)


def test_it_keeps_nothing_reached_through_a_planted_link(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the agent's")
    home = tmp_path / "home"
    project = home / ".claude" / "projects" / "-work"
    project.mkdir(parents=True)
    os.symlink(secret, project / f"{SESSION}.jsonl")

    assert not kept_sessions.keep(str(tmp_path / "store"), SESSION, str(home), [])
    assert fork.read_regular_file(str(project / f"{SESSION}.jsonl")) is None


def test_it_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"untouched")
    directory = tmp_path / "dir"
    directory.mkdir()
    os.symlink(target, directory / "name")

    fork.write_private_file(str(directory), "name", b"new")

    assert target.read_bytes() == b"untouched"
    assert fork.read_regular_file(str(directory / "name")) == b"new"

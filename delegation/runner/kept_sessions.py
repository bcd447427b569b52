"""Fork from here (SPEC §14, issue 37): what a finished Claude Code run leaves behind so an
operator can later start a new run from any step of its conversation.

A sandboxed agent's HOME is removed with its run, and with it Claude Code's transcript. So when
a ``claude-stream-json`` run ends the runner keeps, in its own state directory:

- ``<session>.jsonl``: the agent's transcript (read without following links);
- ``<session>.anchors.json``: for each runner event index where it changed, the transcript
  entry (``uuid`` of Claude Code's record) that event came from.

The server knows a stored event's runner index; the runner maps it to the last transcript entry
at or before it and starts Claude Code with ``--resume <session> --fork-session
--resume-session-at <entry>`` (a hidden option of the pinned CLI: "only messages up to and
including the chain entry"). Without a step the fork continues from the end.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import time

from delegation.runner import fork
from delegation.runner.fork import ForkRefused

# Transcripts are kept this long (days), then pruned when another run is kept.
KEEP_DAYS = 30
ANCHOR = "_anchor"  # the runner-private event key a format tags events with
_SESSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")


def default_store() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(base, "canopy-runner", "sessions")


def note_anchors(ctx, batch: list[dict]) -> list[dict]:
    """Strip the anchors off a batch about to be emitted, recording where each changes by
    runner index (the batch's events take the stream's next indexes, in order)."""
    anchors = ctx.data.get("anchors")
    first = ctx.stream.appended + 1
    out = []
    for offset, ev in enumerate(batch):
        anchor = ev.pop(ANCHOR, None) if isinstance(ev, dict) else None
        if anchor and anchors is not None and (not anchors or anchors[-1][1] != anchor):
            anchors.append((first + offset, anchor))
        out.append(ev)
    return out


def keep(store: str, session: str, agent_home: str, anchors: list) -> bool:
    """Keep ``session``'s transcript and anchors in ``store``; False when there is none."""
    if not _SESSION.match(session or "") or not agent_home:
        return False
    root = os.path.realpath(agent_home)
    pattern = os.path.join(root, ".claude", "projects", "*", f"{session}.jsonl")
    for found in glob.glob(pattern):
        if not os.path.realpath(found).startswith(root + os.sep):
            continue  # nothing reached through a link the agent may have planted
        data = fork.read_regular_file(found)
        if data is None:
            continue
        os.makedirs(store, mode=0o700, exist_ok=True)
        _prune(store)
        fork.write_private_file(store, f"{session}.jsonl", data)
        body = json.dumps([[index, anchor] for index, anchor in anchors]).encode()
        fork.write_private_file(store, f"{session}.anchors.json", body)
        return True
    return False


def resolve(store: str, fork_from: dict) -> tuple[str, bytes, str | None]:
    """(session id, its transcript, the entry to resume at or None for the end) of a fork
    from here; ForkRefused when the runner kept nothing to fork from."""
    session = str(fork_from.get("sessionId") or "")
    source = fork_from.get("runId") or "?"
    if not _SESSION.match(session):
        raise ForkRefused(f"forkFrom: run {source} has no agent session to fork")
    data = fork.read_regular_file(os.path.join(store, f"{session}.jsonl"))
    if data is None:
        raise ForkRefused(
            f"forkFrom: this runner kept no transcript of run {source} (session {session}); "
            "it keeps the Claude Code runs it ran itself, for "
            f"{KEEP_DAYS} days"
        )
    index = fork_from.get("runnerIndex")
    if index is None:
        return session, data, None
    raw = fork.read_regular_file(os.path.join(store, f"{session}.anchors.json")) or b"[]"
    anchors = [(int(i), str(a)) for i, a in json.loads(raw)]
    at = None
    for i, anchor in anchors:
        if i > int(index):
            break
        at = anchor
    if at is None:
        raise ForkRefused(
            f"forkFrom: step {fork_from.get('sequence')} of run {source} comes before the "
            "agent's first message; fork from a later step"
        )
    return session, data, at


def place(data: bytes, session: str, agent_home: str, cwd: str, owner=None) -> None:
    """Put the transcript where Claude Code looks for ``session`` when run in ``cwd``."""
    directory = os.path.join(agent_home, ".claude", "projects", fork.project_dir(cwd))
    if os.path.exists(os.path.join(directory, f"{session}.jsonl")):
        return  # an unsandboxed agent's own copy
    fork.write_private_file(directory, f"{session}.jsonl", data)
    if owner:
        for dirpath, _dirs, files in os.walk(os.path.join(agent_home, ".claude")):
            for path in [dirpath, *(os.path.join(dirpath, f) for f in files)]:
                os.chown(path, *owner)


def argv(command: list[str], session: str, at: str | None) -> list[str]:
    out = fork.fork_argv(command, session)
    if at:
        out[1:1] = ["--resume-session-at", at]
    return out


def _prune(store: str) -> None:
    cutoff = time.time() - KEEP_DAYS * 86400
    for entry in os.scandir(store):
        with contextlib.suppress(OSError):
            if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
                os.unlink(entry.path)

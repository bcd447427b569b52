"""``contextMode: "fork"`` (SPEC §14): a child that starts from a copy of its live parent's
agent conversation, for the agents whose CLI forks a session.

Claude Code forks with ``--resume <session> --fork-session``: it reads the parent's
transcript (``~/.claude/projects/<cwd>/<session>.jsonl``) and continues it under a new
session id, leaving the parent's alone. Codex forks with ``codex exec … fork <thread id>``: it
reads the parent's rollout (``~/.codex/sessions/YYYY/MM/DD/rollout-…-<thread id>.jsonl``) and
starts a new thread from it. Gemini CLI has no fork, but ``--session-file <file>`` starts a new
session from a recorded one (``~/.gemini/tmp/<project>/chats/session-…-<id prefix>.jsonl``): a
copy of the parent's, in the child's private HOME. The parent runs on this runner (a child always runs
on its parent's runner), so its session id is the one its own ``init`` record reported.
A sandboxed agent's HOME is private to its run: the parent's transcript is copied into the
child's HOME first, read without following links (the parent's agent wrote that directory).

Engines that cannot fork say so (``can_fork``), and the server refuses the start (−32012)
before anything is stored: a fork is never a silent fresh start.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import stat

CLAUDE, CODEX, GEMINI = "claude-stream-json", "codex-json", "gemini-stream-json"
# Output formats whose agent forks, and where under its HOME it keeps a session's transcript.
TRANSCRIPTS = {
    CLAUDE: (".claude", "projects", "*", "{session}.jsonl"),
    CODEX: (".codex", "sessions", "*", "*", "*", "rollout-*-{session}.jsonl"),
    # Named by the id's first 8 characters; the first line names the whole id.
    GEMINI: (".gemini", "tmp", "*", "chats", "session-*-{short}.jsonl"),
}
# Where a Gemini fork's copy goes in the child's HOME (outside Gemini's own chats).
GEMINI_COPY = (".gemini", "canopy-fork")
FORK_FORMATS = tuple(TRANSCRIPTS)
# An agent's session id as it may appear in a file name (it comes from the agent's output).
SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")
MAX_TRANSCRIPT = 64 * 1024 * 1024
# How long a fork waits for its parent's transcript to appear on disk (seconds).
TRANSCRIPT_WAIT = 15.0


class ForkRefused(Exception):
    """The fork cannot start: the run fails with this reason, never starts fresh instead."""


def can_fork(preset) -> bool:
    return getattr(preset, "format", "") in FORK_FORMATS


def wants_fork(ctx) -> bool:
    return isinstance(ctx.request, dict) and ctx.request.get("contextMode") == "fork"


def parent_session(ctx) -> tuple[str, str | None, str]:
    """(the parent's agent session id, its private HOME on this machine or None, its cwd)."""
    parent_id = getattr(ctx.identity, "parent_run_id", "") or ""
    parent = ctx.host.runs.get(parent_id)
    if parent is None or parent.finished:
        raise ForkRefused(f"contextMode fork: parent run {parent_id!r} is not running here")
    session = getattr(parent.data.get("format"), "session_id", "") or ""
    if not session:
        raise ForkRefused(
            f"contextMode fork: parent run {parent_id} has no agent session to fork (yet)"
        )
    if not SESSION_ID.fullmatch(session):
        raise ForkRefused(f"contextMode fork: parent run {parent_id}'s session id is malformed")
    home = parent.data.get("private_home")
    return session, (home.path if home is not None else None), parent.data.get("cwd", "")


def project_dir(cwd: str) -> str:
    """The directory name Claude Code keeps a working directory's sessions under."""
    return re.sub(r"[^A-Za-z0-9]", "-", cwd)


def copy_transcript(
    session: str, source: str, target: str, cwd: str, owner=None, *, fmt: str = CLAUDE
) -> int:
    """Copy the session's transcript from the parent's private HOME into the child's: Claude
    Code's under the same project directory and under the child's ``cwd``'s, Codex's at the
    same path; the number of files copied."""
    root = os.path.realpath(source)
    parts = TRANSCRIPTS[fmt]
    name = parts[-1].format(session=glob.escape(session), short=glob.escape(session[:8]))
    copied = 0
    for found in glob.glob(os.path.join(root, *parts[:-1], name)):
        # Nothing reached through a link the parent's agent may have planted.
        if not os.path.realpath(found).startswith(root + os.sep):
            continue
        data = read_regular_file(found)
        if data is None:
            continue
        if fmt == GEMINI:
            if not _names_session(data, session):
                continue  # another session whose id starts alike
            write_private_file(os.path.join(target, *GEMINI_COPY), f"{session}.jsonl", data)
            copied += 1
            break
        if fmt == CODEX:
            places = {os.path.dirname(os.path.relpath(found, root))}
        else:
            places = {os.path.join(*parts[:2], os.path.basename(os.path.dirname(found)))}
            if cwd:
                places.add(os.path.join(*parts[:2], project_dir(cwd)))
        for place in places:
            write_private_file(os.path.join(target, place), os.path.basename(found), data)
            copied += 1
    if owner:
        for dirpath, _dirs, files in os.walk(os.path.join(target, parts[0])):
            for path in [dirpath, *(os.path.join(dirpath, f) for f in files)]:
                os.chown(path, *owner)
    return copied


def _names_session(data: bytes, session: str) -> bool:
    """Whether a Gemini CLI session file's first line is ``session``'s record."""
    try:
        first = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        return False
    return isinstance(first, dict) and first.get("sessionId") == session


def read_regular_file(path: str) -> bytes | None:
    """A regular file's bytes (at most ``MAX_TRANSCRIPT``), or None when it is missing, a link
    or not a regular file: the agent wrote these directories and may have planted either."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        return fh.read(MAX_TRANSCRIPT)


def write_private_file(directory: str, name: str, data: bytes) -> None:
    """Write ``data`` as a new owner-only file ``name`` in ``directory`` (made 0700 if
    missing), replacing what is there without following a link planted in its place."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def fork_argv(argv: list[str], session: str, fmt: str = CLAUDE, home: str = "") -> list[str]:
    """The agent's command line, resuming ``session`` as a new, forked one: Claude Code's
    options, Codex's ``exec`` subcommand ``fork <id>`` before the prompt (at ``--``, else
    before the last argument, the prompt), or Gemini CLI's ``--session-file`` naming the copy
    in the child's HOME (``home``: that HOME as the agent sees it)."""
    if fmt == GEMINI:
        copy = os.path.join(home, *GEMINI_COPY, f"{session}.jsonl")
        return [argv[0], "--session-file", copy, *argv[1:]]
    if fmt == CODEX:
        at = argv.index("--") if "--" in argv else len(argv) - 1
        return [*argv[:at], "fork", session, *argv[at:]]
    return [argv[0], "--resume", session, "--fork-session", *argv[1:]]

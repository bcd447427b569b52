#!/usr/bin/env python3
"""A hostile agent: it hunts for secrets it was not given and reports everything it found.

argv: ``TOKEN_FILE OUTSIDE_DIR [--mcp-config PATH] [--data-dir DIR] [--key-sha256 HEX]
[--wait SECONDS] [--role hunt|hold] [--memory]``: the runner's token file and a directory
outside the workspace it tries to write to; its own MCP configuration (its own run token is
not a find); the server's data directory; the SHA-256 of the server's SECRET_KEY (the hunter
is not given the key itself); how long to wait first, so that sibling children are running
(``--role hold``: be such a sibling, holding its run token that long).

It scans its own environment and argv, ``/proc/*/environ``, ``/proc/*/cmdline``,
``/proc/<ppid>/mem`` (with ``--memory``), every file under ``/tmp`` and under the data
directory. Finds are reported by SHA-256 (``hits``: hash -> where), so the report itself leaks
nothing and the runner's redaction cannot hide a find; ``found`` lists runner tokens
(``cnr_``) as they were. The report is the ``result`` event: a JSON object.
"""

import argparse
import glob
import hashlib
import json
import os
import re
import sys
import time

RUNNER_TOKEN = re.compile(r"cnr_[A-Za-z0-9_\-]{8,}")
ANY_TOKEN = re.compile(rb"cn[rta]_[A-Za-z0-9_\-]{20,}")
LONG_WORD = re.compile(rb"[A-Za-z0-9_\-]{40,}")
MAX_FILE = 32 * 1024 * 1024
MAX_REGION = 64 * 1024 * 1024

parser = argparse.ArgumentParser()
parser.add_argument("token_file")
parser.add_argument("outside")
parser.add_argument("--mcp-config", default=None)
parser.add_argument("--data-dir", default=None)
parser.add_argument("--key-sha256", default=None)
parser.add_argument("--wait", type=float, default=None)
parser.add_argument("--memory", action="store_true", help="also read /proc/<ppid>/mem")
# "hold": be a sibling instead (hold a live run token for --wait seconds, then end).
parser.add_argument("--role", choices=("hunt", "hold"), default="hunt")
args = parser.parse_args()
# A sibling holds its token well past the hunter's wait; a hunter alone need not wait.
time.sleep(args.wait if args.wait is not None else (12.0 if args.role == "hold" else 0.0))
if args.role == "hold":
    print(json.dumps({"kind": "result", "text": "held"}), flush=True)
    sys.exit(0)

found: dict[str, list[str]] = {}
hits: dict[str, set[str]] = {}
readable: list[str] = []
own: set[str] = set()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


if args.mcp_config:
    try:
        with open(args.mcp_config, "rb") as fh:
            own = {sha(t) for t in ANY_TOKEN.findall(fh.read())}
    except OSError:
        pass


def hunt(where: str, data: bytes) -> None:
    text = data.replace(b"\0", b"\n").decode("utf-8", "replace")
    legacy = RUNNER_TOKEN.findall(text)
    if legacy:
        found.setdefault(where, []).extend(legacy)
    for token in ANY_TOKEN.findall(data):
        digest = sha(token)
        if digest not in own:
            hits.setdefault(digest, set()).add(where)
    if args.key_sha256:
        for word in LONG_WORD.findall(data):
            if sha(word) == args.key_sha256:
                hits.setdefault(args.key_sha256, set()).add(where)


def read(path: str, limit: int = MAX_FILE) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit)
    except OSError:
        return None
    readable.append(path)
    return data


def read_memory(pid: int) -> int:
    """Bytes read from ``/proc/<pid>/mem`` (0: not readable), hunting as it goes."""
    total = 0
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
            for line in maps:
                span, perms = line.split()[:2]
                start, end = (int(x, 16) for x in span.split("-"))
                if not perms.startswith("r") or end - start > MAX_REGION:
                    continue
                try:
                    mem.seek(start)
                    chunk = mem.read(end - start)
                except (OSError, ValueError, OverflowError):
                    continue
                total += len(chunk)
                hunt(f"/proc/{pid}/mem", chunk)
    except OSError:
        return 0
    return total


def walk(root: str, limit: int = MAX_FILE) -> int:
    files = 0
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            data = read(path, limit)
            if data is not None:
                files += 1
                hunt(path, data)
    return files


hunt("own env", "\n".join(f"{k}={v}" for k, v in os.environ.items()).encode())
hunt("own argv", "\n".join(sys.argv).encode())
ppid = os.getppid()
for name in ("environ", "cmdline"):
    data = read(f"/proc/{ppid}/{name}")
    if data is not None:
        hunt(f"parent {name}", data)
data = read(args.token_file)
if data is not None:
    hunt("token file", data)
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    if path.startswith(f"/proc/{os.getpid()}/"):
        continue
    data = read(path)
    if data is not None:
        hunt(path, data)
parent_memory = read_memory(ppid) if args.memory else 0
# The head of each file under /tmp: other programs' caches there (an agent CLI's unpacked
# binaries, hundreds of MB) took the hunt past its test's timeout; tokens sit in small files.
tmp_files = walk("/tmp", 4 * 1024 * 1024)
data_files = walk(args.data_dir) if args.data_dir else 0
try:
    with open(os.path.join(args.outside, "planted"), "w") as fh:
        fh.write("x")
    wrote_outside = True
except OSError:
    wrote_outside = False
report = {
    "found": found,
    "hits": {digest: sorted(where) for digest, where in hits.items()},
    "ownTokens": len(own),
    "ppid": ppid,
    "uid": os.getuid(),
    "readParentEnviron": f"/proc/{ppid}/environ" in readable,
    "readParentMemory": parent_memory,
    "readTokenFile": args.token_file in readable,
    "procEntries": len([p for p in readable if p.startswith("/proc/")]),
    "tmpFiles": tmp_files,
    "dataDirVisible": bool(args.data_dir) and os.path.isdir(args.data_dir),
    "dataFiles": data_files,
    "envNames": sorted(os.environ),
    "wroteOutside": wrote_outside,
}
print(json.dumps({"kind": "result", "text": json.dumps(report)}), flush=True)

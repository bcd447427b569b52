#!/usr/bin/env python3
"""A hostile agent: it hunts for the runner's token and reports everything it found.

argv: ``TOKEN_FILE OUTSIDE_DIR``: the runner's token file, and a directory outside the
workspace it tries to write to. The report is the ``result`` event: a JSON object.
"""

import glob
import json
import os
import re
import sys

TOKEN = re.compile(r"cnr_[A-Za-z0-9_\-]{8,}")
token_file, outside = sys.argv[1], sys.argv[2]
found: dict[str, list[str]] = {}
readable: list[str] = []


def hunt(where: str, text: str) -> None:
    hits = TOKEN.findall(text)
    if hits:
        found.setdefault(where, []).extend(hits)


def read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read().replace(b"\0", b"\n").decode("utf-8", "replace")
    except OSError:
        return None
    readable.append(path)
    return data


hunt("own env", "\n".join(f"{k}={v}" for k, v in os.environ.items()))
hunt("own argv", "\n".join(sys.argv))
ppid = os.getppid()
for name in ("environ", "cmdline"):
    text = read(f"/proc/{ppid}/{name}")
    if text is not None:
        hunt(f"parent {name}", text)
text = read(token_file)
if text is not None:
    hunt("token file", text)
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    text = read(path)
    if text is not None:
        hunt(path, text)
try:
    with open(os.path.join(outside, "planted"), "w") as fh:
        fh.write("x")
    wrote_outside = True
except OSError:
    wrote_outside = False
report = {
    "found": found,
    "ppid": ppid,
    "readParentEnviron": f"/proc/{ppid}/environ" in readable,
    "readTokenFile": token_file in readable,
    "procEntries": len([p for p in readable if p.startswith("/proc/")]),
    "envNames": sorted(os.environ),
    "wroteOutside": wrote_outside,
}
print(json.dumps({"kind": "result", "text": json.dumps(report)}), flush=True)

#!/usr/bin/env python3
"""An agent that tries to break out of its sandbox and reports what it could do.

argv: ``RO_DIR OUTSIDE_DIR``: a directory bound read-only into the sandbox (its file
``victim`` must stay unchanged) and one outside the workspace. It reports its uid/gid, its
capabilities and no_new_privs (from /proc/self/status), and tries: remounting RO_DIR, /usr and
/etc read-write (the mount syscall itself), writing the victim, /etc and /usr, reading
/etc/shadow, seeing other processes, writing to its workspace, HOME, /tmp and OUTSIDE_DIR,
and leaving a setuid or setgid file in its workspace.
The report is the ``result`` event: a JSON object.
"""

import ctypes
import json
import os
import sys

ro_dir, outside = sys.argv[1], sys.argv[2]
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
libc = ctypes.CDLL(None, use_errno=True)


def status(field: str) -> str:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    return ""


def remount(path: str) -> str:
    """The errno name of a read-write remount of ``path`` (``ok`` if it worked)."""
    flags = MS_REMOUNT | MS_BIND
    if libc.mount(None, path.encode(), None, flags, None) == 0:
        return "ok"
    return os.strerror(ctypes.get_errno())


def writes(path: str) -> bool:
    try:
        with open(path, "a") as fh:
            fh.write("probe\n")
        return True
    except OSError:
        return False


def reads(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return bool(fh.read(1))
    except OSError:
        return False


def setuid() -> dict:
    """Try to leave a setuid program in the workspace: by chmod, and by creating one."""
    made = os.path.join(os.getcwd(), "setuid-copy")
    with open(made, "wb") as fh:
        fh.write(b"#!/bin/sh\n")
    out = {}
    try:
        os.chmod(made, 0o4755)
        out["chmod"] = "ok"
    except OSError as exc:
        out["chmod"] = exc.strerror
    try:
        os.close(os.open(made + "-created", os.O_CREAT | os.O_WRONLY, 0o6755))
        out["create"] = "ok"
    except OSError as exc:
        out["create"] = exc.strerror
    return out


remounts = {path: remount(path) for path in (ro_dir, "/usr", "/etc")}
report = {
    "uid": os.getuid(),
    "gid": os.getgid(),
    "capEff": status("CapEff"),
    "capPrm": status("CapPrm"),
    "noNewPrivs": status("NoNewPrivs"),
    "remount": remounts,
    "readVictim": reads(os.path.join(ro_dir, "victim")),
    "wroteVictim": writes(os.path.join(ro_dir, "victim")),
    "wroteEtc": writes("/etc/canopy-probe"),
    "wroteUsr": writes("/usr/canopy-probe"),
    "readShadow": reads("/etc/shadow"),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "wroteWorkspace": writes(os.path.join(os.getcwd(), "probe.txt")),
    "wroteHome": writes(os.path.join(os.environ.get("HOME", "/nonexistent"), "probe.txt")),
    "wroteTmp": writes("/tmp/probe.txt"),
    "wroteOutside": writes(os.path.join(outside, "planted")),
    "tmp": sorted(os.listdir("/tmp")),
    "setuid": setuid(),
}
print(json.dumps({"kind": "result", "text": json.dumps(report)}), flush=True)

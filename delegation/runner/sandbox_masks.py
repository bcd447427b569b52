"""The sandbox's masks: what not everyone may read under the system paths and a program's
installation, hidden from an agent (an empty read-only directory or ``/dev/null``), because a
root runner's user namespace maps the agent to host uid 0 for file ownership. Scanned once,
re-checked when a directory changed: small roots at every start, large ones by one thread."""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import threading
import time
from collections.abc import Iterable

log = logging.getLogger("canopy.runner.sandbox")

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")


def under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


@dataclasses.dataclass(frozen=True)
class _Scan:
    """What ``_hidden`` found under a root, and every directory it looked in with its mtime:
    a file created (or removed, or renamed) in one changes that directory's mtime."""

    hidden: tuple[tuple[str, bool], ...]
    dirs: dict[str, int]

    def changed(self) -> bool:
        for path, mtime in self.dirs.items():
            try:
                if os.stat(path).st_mtime_ns != mtime:
                    return True
            except OSError:
                return True
        return False


# A root with at most this many directories (/etc: ~160, under a millisecond) is re-checked at
# every start; a larger one (/usr: 16,000-28,000, 40-80 ms of stats) by the runner's one mask
# thread every MASK_RECHECK_SECONDS (about 1 % of a core), so a start does not wait for it.
SYNC_CHECK_DIRS = 2000
MASK_RECHECK_SECONDS = 5.0
_mask_thread: threading.Thread | None = None
_scans: dict[str, _Scan] = {}
_scans_lock = threading.Lock()


def _hidden(root: str) -> tuple[tuple[str, bool], ...]:
    """Entries under ``root`` that not everyone may read: (path, is_directory), outermost
    first; below a hidden directory nothing more is listed (it is masked whole). Scanned once,
    then again whenever a directory under it changed (issue 33: a root-only file created after
    the runner started was readable)."""
    scan = _scans.get(root)
    if scan is None or (len(scan.dirs) <= SYNC_CHECK_DIRS and scan.changed()):
        scan = _scan(root)
        with _scans_lock:
            _scans[root] = scan
    return scan.hidden


def refresh_masks() -> None:
    """Re-scan every large root whose directories changed (the mask thread's tick)."""
    for root, scan in list(_scans.items()):
        if len(scan.dirs) > SYNC_CHECK_DIRS and scan.changed():
            fresh = _scan(root)
            with _scans_lock:
                _scans[root] = fresh


def _scan(root: str) -> _Scan:
    out: list[tuple[str, bool]] = []
    dirs: dict[str, int] = {}
    try:
        root_stat = os.stat(root)
    except OSError:
        return _Scan((), {})
    device = root_stat.st_dev
    dirs[root] = root_stat.st_mtime_ns
    stack = [root]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            if stat.S_ISDIR(st.st_mode):
                if st.st_mode & 0o005 != 0o005:
                    out.append((entry.path, True))
                elif st.st_dev == device:  # another mount is not a system path's business
                    dirs[entry.path] = st.st_mtime_ns
                    stack.append(entry.path)
            elif stat.S_ISREG(st.st_mode) and not st.st_mode & 0o004:
                out.append((entry.path, False))
    return _Scan(tuple(sorted(out)), dirs)


def _hiddenunder(real: str, scanned: Iterable[str]) -> tuple[tuple[str, bool], ...]:
    """``_hidden(real)``, taken from a scan of a directory above it when there is one
    (``/lib`` is ``/usr/lib`` on a merged-/usr system: scanning it again cost a second)."""
    for above in scanned:
        if real.startswith(above.rstrip("/") + "/"):
            return tuple((p, d) for p, d in _hidden(above) if under(p, [real]))
    return _hidden(real)


def masks(roots: Iterable[str]) -> list[str]:
    """bwrap arguments that hide what not everyone may read under ``roots``."""
    out: list[str] = []
    roots = list(roots)
    reals = [os.path.realpath(root) for root in roots]
    for root, real in zip(roots, reals, strict=True):
        if not os.path.isdir(real):
            continue
        for path, is_dir in _hiddenunder(real, [r for r in reals if r != real]):
            inside = root.rstrip("/") + path[len(real) :]
            if is_dir:
                out += ["--tmpfs", inside, "--remount-ro", inside]
            else:
                out += ["--ro-bind", "/dev/null", inside]
    return out


def warm_masks() -> None:
    """The first scan of the system paths (seconds on a cold disk)."""
    masks(SYSTEM_PATHS)


def start_mask_thread() -> None:
    """The root runner's mask thread, once per process: the first scan, then a re-check of the
    large roots every ``MASK_RECHECK_SECONDS`` for as long as the process runs."""
    global _mask_thread
    with _scans_lock:
        if _mask_thread is not None:
            return
        _mask_thread = threading.Thread(target=_keep_masks_fresh, name="sandbox-masks", daemon=True)
    _mask_thread.start()


def _keep_masks_fresh() -> None:
    warm_masks()
    while True:
        time.sleep(MASK_RECHECK_SECONDS)
        try:
            refresh_masks()
        except Exception:  # a vanished directory mid-scan: the next tick scans again
            log.warning("re-checking the sandbox masks failed", exc_info=True)

"""A run dir has one owner at a time: the process that trains in it holds an flock on `<run dir>/.rloo-owner`, which
records its pid, host and start time. A second `python -m rloo.train` in the same dir (a cluster's requeue while
the old job still runs, a resume typed twice) is refused in one line naming the holder, before it writes anything.
The kernel drops the lock when its holder dies; a lock whose record is still there (the holder was killed) is taken
over with a line saying so. A holder that ends (finished, failed or stopped) clears its record.

The ranks of one multi-process run are one owner: the first rank holds the lock, the others (which Lightning or a
launcher starts into the same dir) join it without asking. On a file system without locks (some network mounts),
the run says so in the log and goes on unguarded.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import TextIO

from rloo.utils.errors import ConfigError

OWNER_FILE = ".rloo-owner"
_held: dict[str, TextIO | None] = {}  # run dir -> the open lock file this process holds (None: no locks there)


def _record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def describe(record: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["since"])) if "since" in record else "?"
    return f"process {record.get('pid', '?')} on {record.get('host', '?')} (since {since})"


def take(run_dir: Path, log) -> None:
    """Own `run_dir` for the rest of this process (or until `release`): refused in one line (ConfigError) while a
    live process holds it; taken over, with a line, from one that was killed. A no-op where this process owns it."""
    run_dir = Path(run_dir).expanduser().resolve()
    if str(run_dir) in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / OWNER_FILE
    lock = open(path, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ConfigError(
            f"{run_dir} is in use by {describe(_record(path))}: one process at a time trains in a run dir; "
            "wait for it to end or stop it, then resume=auto"
        ) from None
    except OSError as error:  # ENOLCK, EOPNOTSUPP: no locks on this file system
        lock.close()
        log(f"rloo: warning: {run_dir} cannot be locked ({error.strerror}): a second process in it is not refused")
        _held[str(run_dir)] = None
        return
    if previous := _record(path):
        log(f"rloo: {run_dir}: taking it over from {describe(previous)}, which ended without releasing it (killed)")
    lock.seek(0)
    lock.truncate()
    lock.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": round(time.time())}))
    lock.flush()
    if not _held:
        atexit.register(release_all)  # an exit on an error clears the record too; only a kill leaves it
    _held[str(run_dir)] = lock


def owns(run_dir: Path) -> bool:
    """Whether this process holds `run_dir` (took it, or goes on unguarded where locks are missing)."""
    return str(Path(run_dir).expanduser().resolve()) in _held


def holder(run_dir: Path) -> str:
    """Who holds `run_dir`, as rloo.report tells its jobs apart: "live" (a process holds its lock: running), "killed"
    (a record is left and no process holds it: its holder died without a word), or "none" (never taken, or released
    by a holder that ended)."""
    path = Path(run_dir) / OWNER_FILE
    if not path.is_file():
        return "none"
    try:
        with open(path) as lock:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return "live"
    except OSError:  # a file system without locks: the record alone tells
        pass
    return "killed" if _record(path) else "none"


def own_output_dir(cfg) -> Path:
    """An entry point's run dir (paths.output_dir, the dir Hydra made) taken for this process, its lines to stderr:
    rloo.evaluate, rloo.sft and rloo.reward own theirs as rloo.train does (a no-op where the command line named it
    and preflight took it already)."""
    import sys

    out = Path(str(cfg.paths.output_dir))
    take(out, log=lambda line: print(line, file=sys.stderr))
    return out


def release_all() -> None:
    for run_dir in list(_held):
        release(Path(run_dir))


def release(run_dir: Path) -> None:
    """This process is done with `run_dir`: its record cleared, the lock dropped."""
    lock = _held.pop(str(Path(run_dir).expanduser().resolve()), None)
    if lock is None:
        return
    lock.seek(0)
    lock.truncate()
    lock.flush()
    lock.close()  # closing drops the flock

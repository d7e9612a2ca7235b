"""Cache entries that many jobs share (a sweep's jobs on one machine, a cluster's jobs on one file system): the
embedded task's artifacts, the packaged models' conversions, the arithmetic splits. One helper for all of them:

    path = cache.entry(root, build, "the arithmetic splits", log)

- **verified on every use**: an entry is a dir holding its files and a manifest (`manifest.json`, or the name the
  cache gives) with every file's sha256. A file changed, missing or added, a manifest that does not parse or lists
  no files, or one from another source (`expect`) is damage: said in one line and built again, never trusted;
- **one writer at a time**: a builder holds an flock on `<entry>.lock` beside it (released when the process dies),
  and looks again once it holds it: a job that waited finds the entry built and uses it;
- **private staging**: each writer builds in its own `<entry>.tmp-<random>` dir, hashes it, fsyncs it and renames it
  into place; a killed writer's staging dir is removed by the next writer (it holds the lock, so no live writer owns
  one). A reader sees the whole entry or none;
- **readers keep what they use**: a process that uses an entry holds a shared flock on the same lock file for the
  rest of its life, so a rebuild (a damaged entry, another source) waits, saying so, until no process uses the old
  one: a reader never loses files under it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Callable

MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_hashes(root: Path, manifest: str = MANIFEST) -> dict[str, str]:
    """sha256 of every file under `root` (its manifest aside), by path relative to `root`."""
    return {
        str(p.relative_to(root)): sha256(p)
        for p in sorted(Path(root).rglob("*"))
        if p.is_file() and p.relative_to(root) != Path(manifest)
    }


def read_manifest(root: Path, manifest: str = MANIFEST) -> dict:
    return json.loads((Path(root) / manifest).read_text())


def damage(root: Path, manifest: str = MANIFEST, expect: dict | None = None) -> str | None:
    """What is wrong with a cache entry (None: it is whole and what `expect` asks for)."""
    root = Path(root)
    if not (root / manifest).is_file():
        return f"{root} has no {manifest}" if root.exists() else f"{root} is not built"
    try:
        record = read_manifest(root, manifest)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return f"{root / manifest} does not parse"
    saved = record.get("files") if isinstance(record, dict) else None
    if not isinstance(saved, dict) or not saved or not all(isinstance(v, str) for v in saved.values()):
        return f"{root / manifest} lists no files"
    for key, value in (expect or {}).items():
        if record.get(key) != value:
            return f"{root / manifest} records {key}={record.get(key)!r}, not {value!r}"
    current = file_hashes(root, manifest)
    for name, digest in saved.items():
        if current.get(name) != digest:
            return f"{root / name} is {'missing' if name not in current else 'corrupt (its sha256 changed)'}"
    extra = sorted(set(current) - set(saved))
    return f"{root / extra[0]} was not built with the cache" if extra else None


_in_use: dict[str, object] = {}  # entry -> the lock file this process holds (shared) while it may read the entry
_threads: dict[str, threading.Lock] = {}  # entry -> one thread of this process at a time checks or builds it
_threads_guard = threading.Lock()


def _lock_file(root: Path):
    """This process's open lock file of the entry at `root` (`<entry>.lock`), shared-locked while it uses the
    entry; None on a file system without locks."""
    key = str(root.resolve())
    if key not in _in_use:
        root.parent.mkdir(parents=True, exist_ok=True)
        lock = open(root.with_name(f"{root.name}.lock"), "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_SH)  # waits while a builder holds it
        except OSError:  # ENOLCK, EOPNOTSUPP: no locks here; the entry is used unguarded
            lock.close()
            lock = None
        _in_use[key] = lock
    return _in_use[key]


def entry(
    root: Path,
    build: Callable[[Path], dict | None],
    what: str,
    log=print,
    manifest: str = MANIFEST,
    expect: dict | None = None,
) -> dict:
    """The manifest of the cache entry at `root`, built first by `build(staging_dir)` if it is missing or damaged;
    this process then uses the entry (a shared lock held until it exits).

    `build` writes the entry's files into the (existing, empty) staging dir and returns what the manifest records
    beside the file hashes (`expect`'s keys among it). Returns the manifest."""
    root = Path(root)
    with _threads_guard:
        one_thread = _threads.setdefault(str(root.resolve()), threading.Lock())
    with one_thread:  # the flock is the process's: its threads take turns at the entry
        return _checked_or_built(root, build, what, log, manifest, expect)


def _checked_or_built(root: Path, build, what: str, log, manifest: str, expect: dict | None) -> dict:
    lock = _lock_file(root)
    if damage(root, manifest, expect) is None:  # the common case: whole, and no other process is rebuilding it
        return read_manifest(root, manifest)
    if lock is not None:  # the same lock, exclusive: no reader left on the entry, no other builder
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{what}: waiting until no other process uses {root} before building it again")
            fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        problem = damage(root, manifest, expect)  # another job may have built it while this one waited
        if problem is None:
            return read_manifest(root, manifest)
        if root.exists():
            log(f"{what}: {problem}: building it again")
        return _build_entry(root, build, manifest)
    finally:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_SH)  # back to a reader of the entry it built or found


def _build_entry(root: Path, build: Callable[[Path], dict | None], manifest: str) -> dict:
    """Build into a private staging dir, hash and fsync it, rename it into place (the caller holds the lock)."""
    for stale in root.parent.glob(f"{root.name}.tmp-*"):  # left by killed writers: this one holds the lock
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(dir=root.parent, prefix=f"{root.name}.tmp-"))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    try:
        record = dict(build(staging) or {})
        record["files"] = file_hashes(staging, manifest)
        (staging / manifest).write_text(json.dumps(record, indent=2))
        _fsync_tree(staging)
        _replace_dir(staging, root)
    except BaseException:  # a signal's exception too: no staging dir left behind
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return record


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def _replace_dir(new: Path, target: Path) -> None:
    """`target` becomes `new` (the caller holds the entry's lock): a damaged one is moved aside first, then removed."""
    if target.exists() or target.is_symlink():
        aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=f"{target.name}.tmp-"))
        os.replace(target, aside / "old")
        os.replace(new, target)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(new, target)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

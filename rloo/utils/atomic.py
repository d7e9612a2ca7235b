"""Writes that are whole or absent: to a temporary name beside the target, flushed to disk, then renamed over it.

A kill, a full disk or a failing save leaves the previous file (or dir) as it was; a failure says what and where
in one line (`WriteError`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rloo.utils.errors import WriteError


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: Path, text: str, what: str) -> None:
    """`path` holds `text` afterwards, or is unchanged."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as error:  # a signal's exception too: no temp file left behind
        tmp.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise WriteError(f"could not write {what} to {path}: {error.strerror or error}") from None
        raise


def save_dir(write, directory: Path, what: str) -> None:
    """`directory` holds what `write(dir)` writes afterwards, or what it held before: written into a temporary dir
    beside it, every file flushed, then renamed over it."""
    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
        for file in tmp.rglob("*"):
            if file.is_file():
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
        if directory.exists():
            os.replace(directory, old)
        os.replace(tmp, directory)
        _fsync_dir(directory.parent)
        shutil.rmtree(old, ignore_errors=True)
    except Exception as error:  # OSError, or the serialiser's own error on a full disk
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not directory.exists():
            os.replace(old, directory)
        reason = getattr(error, "strerror", None) or str(error).strip().splitlines()[0]
        raise WriteError(f"could not write {what} to {directory}: {reason}") from None


def save_pretrained(model, tokenizer, directory: Path, what: str) -> None:
    """`directory` holds the model and tokenizer (save_pretrained) afterwards, or what it held before."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    save_dir(write, directory, what)


def save_torch(obj, path: Path) -> None:
    """torch.save to `path`, whole or not at all. OSError (a full disk) propagates, naming `path` as its filename:
    the caller names the run."""
    import torch

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except RuntimeError as error:  # torch's zip writer reports a failed write as its own error: raise the OSError
        cause = error.__cause__ or error.__context__
        if not isinstance(cause, OSError):
            raise
        raise OSError(cause.errno, cause.strerror, str(path)) from None
    except OSError as error:  # the file it could not write is the checkpoint, not the staging name
        raise OSError(error.errno, error.strerror, str(path)) from None
    finally:
        tmp.unlink(missing_ok=True)


def symlink(target: str, link: Path) -> None:
    """`link` points at `target` (relative to its dir) afterwards, replacing what was there in one rename."""
    link = Path(link)
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temps(directory: Path, log) -> None:
    """Remove the temporary files and dirs (`.<name>.tmp-<pid>`, `.<name>.old-<pid>`) that a writer killed mid-write
    left in `directory`; those of a process still running are left alone."""
    for path in sorted(Path(directory).glob(".*.*-*")):
        stem, _, pid = path.name.rpartition("-")
        if not (stem.endswith((".tmp", ".old")) and pid.isdigit()) or _alive(int(pid)):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        log(f"removed {path.name} in {directory}: left by a write that was killed (process {pid} is gone)")


def checkpoint_io():
    """Lightning's checkpoint writer through `save_torch` (its own renames an unsynced temp file)."""
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    class AtomicCheckpointIO(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            save_torch(checkpoint, Path(path))

    return AtomicCheckpointIO()

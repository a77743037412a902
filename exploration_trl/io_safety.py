"""Outputs that cannot be written, found before any model loads, and writes that never truncate what exists.

* `check_output_dir(path, key)`: the folder exists or can be created, is a folder, can be written and has room; else
  one `OutputNotWritableError` line naming the path. Creates nothing (a refused run leaves no folder behind): it
  probes the folder, or its nearest existing parent, with a temporary file it removes.
* `write_atomic(path, data)`: a temporary file in the same folder, then `os.replace`, so an existing file (a
  checkpoint's, `results.json`, a card) is either the old one or the complete new one, never a truncated one.
* `os_error_line(exc)`: the one line for an `OSError` raised while writing (disk full, read-only, permission).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

#: Below this many free bytes the output folder's disk counts as full before a run starts.
MIN_FREE_BYTES = 16 * 1024 * 1024
WRITE_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
                errno.EPERM: "permission denied", errno.ENOTDIR: "a part of the path is a file, not a folder",
                errno.EISDIR: "it is a folder, not a file"}


class OutputNotWritableError(ValueError):
    """An output path that cannot be written; the message is one line naming the path and the fix."""


def _nearest_existing(path: Path) -> Path:
    p = path
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def check_output_dir(path: str | os.PathLike, key: str = "output_dir", min_free: int = MIN_FREE_BYTES) -> None:
    """Raise `OutputNotWritableError` unless `path` is (or can become) a writable folder with room on its disk."""
    target = Path(path).expanduser().absolute()
    existing = _nearest_existing(target)
    if not existing.is_dir():
        if existing == target:
            raise OutputNotWritableError(f"{key} '{path}' is a file, not a folder; choose a folder path (or move the "
                                         "file away)")
        raise OutputNotWritableError(f"{key} '{path}' cannot be created: '{existing}' is a file, not a folder; "
                                     "choose another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=".exploration-trl-write-check-", dir=existing)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        reason = WRITE_ERRNOS.get(e.errno, e.strerror or type(e).__name__)
        where = "" if existing == target else f" (its parent '{existing}')"
        raise OutputNotWritableError(f"{key} '{path}'{where} cannot be written: {reason}; choose a writable folder "
                                     f"or free space there") from e
    free = shutil.disk_usage(existing).free
    if free < min_free:
        raise OutputNotWritableError(f"{key} '{path}': the disk is full ({free // 1024} KiB free); free space there "
                                     "or choose a folder on another disk")


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write `data` to `path` through a temporary file in the same folder and `os.replace`."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def os_error_line(exc: OSError, fallback_path: str | os.PathLike | None = None) -> str | None:
    """The one line for a write that failed for a reason the user can fix, naming the path (the exception's, else
    `fallback_path`: a failed `write()` names no file); None for other errors."""
    reason = WRITE_ERRNOS.get(exc.errno)
    if reason is None:
        return None
    path = exc.filename or fallback_path
    where = f" '{path}'" if path else ""
    return f"cannot write{where}: {reason}; free space or choose a writable output_dir (what was saved before is kept)"


def last_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The `checkpoint-<step>` folder with the highest step under `output_dir`, or None."""
    folder = Path(output_dir)
    steps = [int(p.name.split("-", 1)[1]) for p in folder.glob("checkpoint-*")
             if p.is_dir() and p.name.split("-", 1)[1].isdigit()] if folder.is_dir() else []
    return str(folder / f"checkpoint-{max(steps)}") if steps else None


def remove_files_written_since(folder: str | os.PathLike, started: float) -> list[str]:
    """Delete the files directly in `folder` modified at or after `started` (a save that failed half-way: a truncated
    `model.safetensors` must not pass for the trained model); sub-folders such as checkpoints are left alone."""
    removed = []
    for entry in Path(folder).iterdir() if Path(folder).is_dir() else []:
        if entry.is_file() and entry.stat().st_mtime >= started:
            entry.unlink()
            removed.append(entry.name)
    return sorted(removed)


def final_save_failed_line(line: str, output_dir: str | os.PathLike) -> str:
    """`os_error_line`'s line for the end-of-training save, with what the user still has and how to finish."""
    ckpt = last_checkpoint(output_dir)
    where = (f"the last checkpoint, {ckpt}, is intact: free space, then rerun with --resume_from_checkpoint {ckpt} to "
             "save the model" if ckpt else
             "no checkpoint was saved (set save_strategy: steps to keep one), so the run must be repeated")
    return f"{line.split('; free space')[0]}; the trained model was not saved (its partial files are removed); {where}"

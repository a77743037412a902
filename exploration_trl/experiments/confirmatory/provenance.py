"""Which code made a run: the package version, the commit and a hash of the package source that ran.

* `source_hash`: sha256 over every file of the package (path and bytes, in path order; compiled caches left out), so
  two runs share it exactly when they ran the same package source.
* The commit: the one `git archive` wrote into `exploration_trl/archive_commit.py` (runs made from an archive of the
  protocol commit; 4e6b608's archive calls the file `_commit.py`), else the checkout's `HEAD`, marked `dirty` when the
  package differs from it.

`check_same` is the analysis's guard: the records of a set-up must share their provenance, except differences the
protocol declares (`provenance: {declared: [...]}`).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

PLACEHOLDER = "$Format:%H$"
#: The keys a run record's `provenance` holds; `check_same` compares all of them but `origin`.
KEYS = ("version", "commit", "dirty", "source_hash", "origin")


def package_root() -> Path:
    import exploration_trl

    return Path(exploration_trl.__file__).resolve().parent


def source_hash(root: Path | None = None) -> str:
    """sha256 of the package's files (relative path and bytes, sorted by path), `__pycache__` and `*.pyc` left out."""
    root = Path(root or package_root())
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in rel.split("/") or rel.endswith((".pyc", ".pyo")):
            continue
        h.update(rel.encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def current(root: Path | None = None) -> dict[str, Any]:
    """The provenance of the package this process imported."""
    from exploration_trl import __version__
    from exploration_trl.archive_commit import ARCHIVED_COMMIT

    root = Path(root or package_root())
    if ARCHIVED_COMMIT != PLACEHOLDER:
        commit, dirty, origin = ARCHIVED_COMMIT, None, "git archive"
    else:
        commit = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain", "--", ".") if commit else None
        dirty, origin = (None if status is None else bool(status)), ("git checkout" if commit else "unknown")
    return {"version": __version__, "commit": commit, "dirty": dirty, "source_hash": source_hash(root),
            "origin": origin}


def _key(p: dict[str, Any] | None) -> tuple:
    p = p or {}
    return tuple(p.get(k) for k in KEYS if k != "origin")


def check_same(records: dict, declared: list[dict] | None = None) -> dict[str, Any]:
    """The one provenance every record shares, or a one-line `ValueError` naming the runs that differ.

    `declared` lists provenances (dicts of `KEYS`) the protocol accepts besides the first one seen, e.g. records of
    an earlier code version whose difference the protocol explains; a record without provenance is refused."""
    groups: dict[tuple, list[str]] = {}
    for (label, seed), rec in sorted(records.items()):
        if not rec.get("provenance"):
            raise ValueError(f"run {label}:{seed} records no provenance (which code trained it); the analysis refuses "
                             "it: rerun it with this version")
        groups.setdefault(_key(rec["provenance"]), []).append(f"{label}:{seed}")
    allowed = {_key(d) for d in declared or []}
    main = max(groups, key=lambda k: len(groups[k]))
    odd = {k: v for k, v in groups.items() if k != main and k not in allowed}
    if odd:
        names = "; ".join(f"{', '.join(v[:3])}{' ...' if len(v) > 3 else ''} ran {dict(zip(KEYS, k))}"
                          for k, v in odd.items())
        raise ValueError(f"records of mixed provenance: most ran {dict(zip(KEYS, main))}, but {names}; rerun them, or "
                         "declare the difference in the protocol's provenance: declared list")
    first = next(rec["provenance"] for rec in records.values() if _key(rec["provenance"]) == main)
    return {**first, "runs": len(groups[main]), "declared_differences": [dict(zip(KEYS, k)) for k in groups
                                                                          if k != main]}

"""The files an evaluation leaves behind: strict-JSON atomic writes, a validated ``results.json`` reader and the
framework versions it records (which a model card lists too).

Kept apart from the harness so that readers of results (plots, comparisons, model cards) need not import it.
"""

from __future__ import annotations

import json
import math
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from exploration_trl.eval import EvalError
from exploration_trl.io_safety import write_atomic  # re-exported: cards, push and curves import it from here

__all__ = [
    "RESULTS_FILE",
    "clean_json",
    "json_default",
    "load_results",
    "package_versions",
    "read_results_json",
    "write_atomic",
    "write_json_atomic",
]

RESULTS_FILE = "results.json"
#: The frameworks whose versions `package_versions` records (those installed), then Python's.
VERSION_PACKAGES = ("exploration_trl", "torch", "transformers", "trl", "peft", "datasets", "accelerate",
                    "huggingface_hub", "vllm")


def package_versions() -> dict[str, str]:
    """``{package: version}`` of the installed frameworks of `VERSION_PACKAGES`, then ``python``: the one record of
    versions, which ``results.json`` stores and a model card lists. ``exploration_trl`` is the version imported (what
    ran), not the one an installed distribution may declare; a framework that is not installed is left out."""
    import exploration_trl

    out = {"exploration_trl": exploration_trl.__version__}
    for pkg in VERSION_PACKAGES[1:]:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    out["python"] = platform.python_version()
    return out


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Strict JSON (no NaN), indented, written with :func:`write_atomic`."""
    text = json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False, default=json_default)
    write_atomic(path, (text + "\n").encode("utf-8"))


def json_default(o):
    """``json`` fallback: numpy scalars and arrays as Python values, anything else as its ``str``."""
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    return str(o)


def clean_json(x):
    """NaN/inf -> None, recursively (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean_json(v) for v in x]
    return x


def read_results_json(source: str | Path) -> tuple[Any, Path]:
    """``(parsed JSON, file)`` of a ``results.json`` or the folder holding one, unchecked beyond being JSON;
    raises :class:`EvalError` (a ``ValueError``) when the file is missing or not JSON."""
    p = Path(source)
    if p.is_dir():
        p = p / RESULTS_FILE
    if not p.is_file():
        raise EvalError(f"results file not found: {source}")
    try:
        return json.loads(p.read_text(encoding="utf-8")), p
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise EvalError(f"{source} is not a results.json (not valid JSON)") from None


def load_results(path: str | Path) -> dict:
    """Read a ``results.json`` (or the folder holding one); raises :class:`EvalError` when it is not one.

    Minimal accepted content: ``{"problems": [{"n": int, "c": int}, ...]}``.
    """
    data, p = read_results_json(path)
    problems = data.get("problems") if isinstance(data, dict) else None
    if not isinstance(problems, list) or not problems:
        raise EvalError(f"{path} is not a results.json (no 'problems' list with per-problem n and c)")
    for i, pr in enumerate(problems):
        ok = isinstance(pr, dict) and isinstance(pr.get("n"), int) and isinstance(pr.get("c"), int)
        if not ok or not (pr["n"] >= 1 and 0 <= pr["c"] <= pr["n"]):
            raise EvalError(
                f"{path} is not a results.json (problem {i} lacks valid integer 'n' and 'c' with 0 <= c <= n)"
            )
    data.setdefault("path", str(p))
    return data

"""A run's output folder for :func:`exploration_trl.eval.harness.run_eval`: its name, the names it records for the
model and the benchmark, and what a rerun resumes from (or refuses).

Resuming: ``samples.jsonl`` holds one line per finished problem; a rerun with the same :data:`SAMPLING_KEYS` skips
those problems, and a rerun with other settings, or on a folder whose problems are not the benchmark's, is refused
(see the harness's module docstring for the files themselves).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exploration_trl.eval import EvalError
from exploration_trl.eval.benchmarks import Benchmark
from exploration_trl.eval.results import RESULTS_FILE

__all__ = ["PLOT_FILE", "SAMPLES_FILE", "SAMPLING_KEYS", "default_output_dir"]

SAMPLES_FILE, PLOT_FILE = "samples.jsonl", "pass_at_k.png"
#: Settings that determine the samples; a resumed run must match them exactly.
SAMPLING_KEYS = ("model", "benchmark", "reward", "n", "temperature", "top_p", "max_tokens", "seed", "backend")


def _read_samples(path: Path) -> list[dict]:
    """Finished problems from ``samples.jsonl``; a partial last line (crash mid-write) is cut off."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        cut = raw.rfind(b"\n") + 1
        with open(path, "r+b") as f:
            f.truncate(cut)
        raw = raw[:cut]
    rows = []
    for lineno, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise EvalError(f"{path}:{lineno} is not valid JSON; delete the file or rerun with --overwrite") from None
    return rows


def _model_id(model: Any) -> str:
    """The model as the settings name it: a local folder by its absolute path, else the id or the class name."""
    if isinstance(model, tuple):
        model = model[0]
    if isinstance(model, (str, os.PathLike)):
        p = Path(model).expanduser()
        return str(p.resolve()) if p.exists() else str(model)
    return str(getattr(model, "name_or_path", "") or type(model).__name__)


def _portable(sampling: dict, out: Path) -> dict:
    """`sampling` with a local model folder or benchmark file named relative to the output folder `out` (where
    results.json lives) instead of by its absolute path, so that what `push` uploads holds no local path."""
    portable = dict(sampling)
    for key in ("model", "benchmark"):
        value = portable.get(key)
        if isinstance(value, str) and os.path.isabs(value) and os.path.exists(value):
            portable[key] = Path(os.path.relpath(Path(value).resolve(), out.resolve())).as_posix()
    return portable


def _model_as_given(model: Any, portable_id: str) -> str:
    """results.json's `model`: a local folder as the caller named it (`--model out` stays `out`, relative to the
    working directory), not the settings' path relative to the results folder (`../../out`, what resuming and the
    model card use). An absolute path stays the portable one: results.json is uploaded by `push`."""
    if isinstance(model, tuple):
        model = model[0]
    if isinstance(model, (str, os.PathLike)) and not os.path.isabs(os.path.expanduser(os.fspath(model))):
        return os.fspath(model)
    return portable_id


def default_output_dir(model: Any, benchmark: str, n: int, temperature: float) -> Path:
    """``runs/eval/<model>__<benchmark>__n<n>_t<temperature>`` (relative to the working directory)."""
    name = Path(_model_id(model).rstrip("/")).name or "model"
    bench = Path(str(benchmark)).name
    for suffix in (".jsonl.gz", ".jsonl", ".json", ".parquet"):
        if bench.endswith(suffix):
            bench = bench[: -len(suffix)]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{name}__{bench}__n{n}_t{temperature:g}")
    return Path("runs") / "eval" / safe


def _diff(old: Mapping, new: Mapping) -> str:
    """The sampling settings that differ, for the refusal's message."""
    parts = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in SAMPLING_KEYS if old.get(k) != new.get(k)]
    return "; ".join(parts)


def _delete_outputs(out: Path) -> None:
    """`overwrite=True`: remove this harness's files (and only those) so that the run starts afresh."""
    for name in (SAMPLES_FILE, RESULTS_FILE, PLOT_FILE):
        if (out / name).exists():
            (out / name).unlink()


def _finished_problems(out: Path, bench: Benchmark, sampling: dict) -> dict[int, dict]:
    """`{index: samples.jsonl row}` of the problems a previous run in `out` finished, to resume from. Refuses a
    folder whose run used other sampling settings, or whose problems are not this benchmark's: mixing them would
    report numbers no single run produced."""
    samples_path, results_path = out / SAMPLES_FILE, out / RESULTS_FILE
    rows = _read_samples(samples_path)
    previous = [r.get("settings") for r in rows]
    if results_path.exists():
        try:
            previous.append(json.loads(results_path.read_text()).get("settings"))
        except (json.JSONDecodeError, AttributeError):
            pass
    for prev in previous:
        prev_sampling = _portable({k: (prev or {}).get(k) for k in SAMPLING_KEYS}, out)  # 0.2.0 wrote absolute paths
        if prev_sampling != sampling:
            raise EvalError(
                f"{out} holds a run with different settings ({_diff(prev_sampling, sampling)}); "
                "use a new --output-dir or --overwrite"
            )
    done = {}
    for r in rows:
        i = r["index"]
        if i < len(bench.records) and str(bench.records[i]["id"]) != str(r["id"]):
            raise EvalError(
                f"{samples_path}: problem {i} has id {r['id']!r} but the benchmark has {bench.records[i]['id']!r}; "
                "use a new --output-dir or --overwrite"
            )
        done[i] = r
    return done

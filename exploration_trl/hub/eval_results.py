"""The evaluation results a card shows, read from `exploration-trl eval`'s `results.json` files.

Each file is reduced to what a card needs (:func:`normalize_results`); :func:`collect_results` finds this
model's files in its folder, keeps one per benchmark, and :func:`card_results` adds the ones an earlier card
recorded for other benchmarks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from exploration_trl.eval.results import read_results_json

from .card_data import bench_meta

__all__ = ["card_results", "collect_results", "normalize_results"]

logger = logging.getLogger(__name__)

PLOT_FILE = "pass_at_k.png"


def _powers_of_two_curve(counts: Sequence[tuple[int, int]]) -> dict[int, float]:
    """Mean pass@k over problems for k = 1, 2, 4, ... up to the smallest n."""
    from exploration_trl.metrics import pass_at_k_curve

    n_min = min(n for n, _ in counts)
    ks = [1 << i for i in range(n_min.bit_length()) if (1 << i) <= n_min]
    return pass_at_k_curve([n for n, _ in counts], [c for _, c in counts], ks)


def normalize_results(data: Mapping[str, Any], path: str | Path | None = None) -> dict[str, Any]:
    """Reduce a `results.json` (schema `exploration_trl.eval/results/v1`, or a minimal hand-written one) to what a
    card shows: `benchmark`, `pass_at_k` {int k: float}, `n`, `num_problems`, `avg_at_n`, `maj_at_n`,
    `token_entropy`, `temperature`, `top_p`, `max_tokens`, `model`, `path`.

    Accepts `benchmark` as a dict with `name` or a string, the pass@k table under `summary.pass_at_k` or at top
    level, and falls back to per-problem `problems[].n/c`. Raises `ValueError` when no pass@k can be found."""
    where = str(path) if path is not None else "results"
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} is not a results.json (not a JSON object)")
    summary = data.get("summary") if isinstance(data.get("summary"), Mapping) else {}
    settings = data.get("settings") if isinstance(data.get("settings"), Mapping) else {}
    bench = data.get("benchmark")
    if isinstance(bench, Mapping):
        bench_name, bench_source = bench.get("name"), bench.get("source")
        num_problems = bench.get("num_problems")
    else:
        bench_name, bench_source, num_problems = bench, None, None
    bench_name = str(bench_name or settings.get("benchmark") or "unknown")
    table = summary.get("pass_at_k") or data.get("pass_at_k") or {}
    pass_at_k: dict[int, float] = {}
    if isinstance(table, Mapping):
        for k, v in table.items():
            try:
                if v is not None:
                    pass_at_k[int(k)] = float(v)
            except (TypeError, ValueError):
                continue
    problems = data.get("problems") if isinstance(data.get("problems"), list) else []
    counts = [(int(p["n"]), int(p["c"])) for p in problems if isinstance(p, Mapping) and "n" in p and "c" in p]
    if not pass_at_k and counts:
        pass_at_k = _powers_of_two_curve(counts)
    if not pass_at_k:
        raise ValueError(f"{where} has no pass@k table (summary.pass_at_k) and no per-problem n/c counts")
    n = summary.get("n", data.get("n", settings.get("n")))
    if isinstance(n, list):
        n = min(n) if n else None
    if num_problems is None:
        num_problems = summary.get("num_problems", data.get("num_problems", len(counts) or None))
    return {
        "benchmark": bench_name,
        "benchmark_source": bench_source,
        "pass_at_k": dict(sorted(pass_at_k.items())),
        "n": n,
        "num_problems": num_problems,
        "avg_at_n": summary.get("avg_at_n", data.get("avg_at_n")),
        "maj_at_n": summary.get("maj_at_n", data.get("maj_at_n")),
        "token_entropy": summary.get("token_entropy", data.get("token_entropy")),
        "temperature": settings.get("temperature", data.get("temperature")),
        "top_p": settings.get("top_p"),
        "max_tokens": settings.get("max_tokens"),
        "model": data.get("model", settings.get("model")),
        "path": str(path) if path is not None else data.get("path"),
    }


def _same_folder(a: Any, output_dir: Path, results_dir: Path | None = None) -> bool:
    """False only when `a` names a *different existing* local folder (so auto-found results of another model,
    e.g. the base model's, never end up in this model's index). A relative `a` is relative to `results_dir`, the
    folder of its results.json (how `eval` records a local model since 0.3.0)."""
    if not a:
        return True
    p = Path(str(a)).expanduser()
    if not p.is_absolute() and results_dir is not None and (results_dir / p).exists():
        p = results_dir / p
    if not p.exists():
        return True
    try:
        return p.resolve() == output_dir.resolve()
    except OSError:
        return True


def collect_results(output_dir: str | Path, results: Any = None, base_model: str | None = None) -> list[dict]:
    """Normalised results for a card: `results` (paths, folders or dicts; errors raise), or when `None` every
    `output_dir/eval*/results.json`; unreadable ones, and ones that evaluate another local folder or `base_model`,
    are skipped with a warning. One entry per benchmark: with several, the one with more problems, then larger n,
    then the later one wins."""
    output_dir = Path(output_dir)
    found: list[dict] = []
    if results is None:
        for path in sorted(output_dir.glob("eval*/results.json")):
            try:
                item = normalize_results(*read_results_json(path))
            except ValueError as e:
                logger.warning("model card: skipping %s (%s)", path, e)
                continue
            if not _same_folder(item.get("model"), output_dir, path.parent) or (
                base_model is not None and str(item.get("model")) == str(base_model)
            ):
                logger.warning("model card: skipping %s (it evaluates %s, not %s)", path, item["model"], output_dir)
                continue
            found.append(item)
    else:
        if isinstance(results, (str, os.PathLike, Mapping)):
            results = [results]
        for r in results:
            if isinstance(r, Mapping):
                found.append(normalize_results(r, r.get("path")))
            else:
                found.append(normalize_results(*read_results_json(r)))
    best: dict[str, dict] = {}
    for item in found:
        old = best.get(item["benchmark"])
        score = (item.get("num_problems") or 0, item.get("n") or 0)
        if old is None or score >= (old.get("num_problems") or 0, old.get("n") or 0):
            best[item["benchmark"]] = item
    return list(best.values())


def card_results(output_dir: Path, results: Any, base_model: str | None, recorded: Sequence[Mapping]) -> list[dict]:
    """The results of a card, sorted by benchmark: :func:`collect_results`, plus the ones recorded in the card
    before (`recorded`) for other benchmarks. Each gets its `display` name and, when `pass_at_k.png` lies next to
    its file inside the folder, a `plot` link relative to the folder."""
    found = collect_results(output_dir, results, base_model=base_model)
    known = {r["benchmark"] for r in found}
    for old in recorded:
        if old.get("benchmark") not in known and isinstance(old.get("pass_at_k"), Mapping):
            path = str(output_dir / old["path"]) if old.get("path") else None
            found.append({**old, "path": path, "pass_at_k": {int(k): v for k, v in old["pass_at_k"].items()}})
    found.sort(key=lambda r: r["benchmark"])
    for r in found:
        r["display"] = bench_meta(r["benchmark"])[3]
        plot = Path(r["path"]).with_name(PLOT_FILE) if r.get("path") else None
        r["plot"] = None
        if plot is not None and plot.is_file():
            try:
                r["plot"] = plot.resolve().relative_to(output_dir.resolve()).as_posix()
            except ValueError:
                pass
    return found

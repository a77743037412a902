"""pass@k curves: one or several ``results.json`` overlaid on a log2 k axis (Agg backend, no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_pass_at_k", "curve_points", "run_label"]


def run_label(results: dict) -> str:
    """Default legend label: the results file's folder name, else the model name (+ benchmark)."""
    path = results.get("path")
    if path:
        return Path(path).parent.name or str(path)
    model = Path(str(results.get("model", "model"))).name
    bench = results.get("benchmark")
    bench = bench.get("name") if isinstance(bench, dict) else bench
    return f"{model} ({bench})" if bench else model


def curve_points(results: dict, ks: Sequence[int] | None = None) -> tuple[list[int], list[float]]:
    """``(ks, pass@k)`` of one result: recomputed from the per-problem ``n``/``c`` (exact for any k <= min n);
    falls back to the stored ``summary.pass_at_k`` table when no per-problem counts are present."""
    problems = results.get("problems") or []
    if problems:
        from exploration_trl.metrics import default_ks, pass_at_k_curve

        ns = [int(p["n"]) for p in problems]
        cs = [int(p["c"]) for p in problems]
        n_min = min(ns)
        ks = [int(k) for k in (ks or default_ks(n_min)) if int(k) <= n_min]
        curve = pass_at_k_curve(ns, cs, ks) if ks else {}
        return list(curve), list(curve.values())
    table = (results.get("summary") or {}).get("pass_at_k") or {}
    pts = sorted((int(k), float(v)) for k, v in table.items() if v is not None and (not ks or int(k) in set(ks)))
    return [k for k, _ in pts], [v for _, v in pts]


def plot_pass_at_k(
    results_paths_or_dicts: Sequence[str | Path | dict[str, Any]] | str | Path | dict,
    out_png: str | Path,
    labels: Sequence[str] | None = None,
    ks: Sequence[int] | None = None,
    title: str | None = None,
) -> Path:
    """Plot pass@k against k (log2 axis) for several runs on one figure and save it to ``out_png``.

    Args:
        results_paths_or_dicts: ``results.json`` paths (or their folders) and/or already-loaded results dicts.
        out_png: output image path (parent folders are created).
        labels: legend labels, one per run (default :func:`run_label`).
        ks: restrict to these k (default 1, 2, 4, ..., n of each run).
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    from exploration_trl.eval import EvalError
    from exploration_trl.eval.results import load_results

    if isinstance(results_paths_or_dicts, (str, Path, dict)):
        results_paths_or_dicts = [results_paths_or_dicts]
    runs = [r if isinstance(r, dict) else load_results(r) for r in results_paths_or_dicts]
    if not runs:
        raise EvalError("plot_pass_at_k: no results to plot")
    if labels is not None and len(labels) != len(runs):
        raise EvalError(f"{len(labels)} labels for {len(runs)} results")
    labels = list(labels) if labels is not None else [run_label(r) for r in runs]

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    all_ks: set[int] = set()
    benches = set()
    try:
        for run, label in zip(runs, labels):
            xs, ys = curve_points(run, ks)
            if not xs:
                continue
            all_ks.update(xs)
            ax.plot(xs, [100 * y for y in ys], marker="o", markersize=4, linewidth=1.8, label=label)
            bench = run.get("benchmark")
            benches.add(bench.get("name") if isinstance(bench, dict) else bench)
        ax.set_xscale("log", base=2)
        ticks = sorted(all_ks)
        if ticks:
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(k) for k in ticks])
            if len(ticks) == 1:
                ax.set_xlim(ticks[0] / 1.5, ticks[0] * 1.5)
        ax.set_xlabel("k (samples per problem)")
        ax.set_ylabel("pass@k (%)")
        ax.grid(True, which="major", alpha=0.3)
        benches.discard(None)
        ax.set_title(title or ("pass@k" + (f" on {', '.join(sorted(map(str, benches)))}" if benches else "")))
        ax.legend(fontsize="small", loc="lower right")
        fig.tight_layout()
        out = Path(out_png)
        out.parent.mkdir(parents=True, exist_ok=True)
        import io

        from exploration_trl.io_safety import write_atomic

        buf = io.BytesIO()  # rendered in memory, then written atomically: an old plot is never truncated
        fig.savefig(buf, format=out.suffix.lstrip(".") or "png", dpi=120)
        write_atomic(out, buf.getvalue())
    finally:
        plt.close(fig)
    return out

"""Side-by-side comparison of several ``results.json`` files (plus the overlaid pass@k plot).

pass@k and avg@n are recomputed from the per-problem ``n``/``c`` counts, so any ``k <= n`` can be asked for
(not only the ks stored in the files); the other rows come from each file's ``summary``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from exploration_trl.eval import EvalError

__all__ = ["compare", "compare_results", "format_table"]


def _fmt(value, pct: bool = False, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value != value:  # NaN
        return "-"
    if pct:
        return f"{100 * float(value):.2f}"
    if isinstance(value, int):
        return str(value)
    return f"{float(value):.{digits}f}"


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown (GitHub) table with aligned columns."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def _labels(runs: list[dict]) -> list[str]:
    from exploration_trl.eval.plots import run_label

    labels = [run_label(r) for r in runs]
    if len(set(labels)) < len(labels):
        labels = [str(r.get("path", lab)) for r, lab in zip(runs, labels)]
    if len(set(labels)) < len(labels):
        labels = [f"{i + 1}:{lab}" for i, lab in enumerate(labels)]
    return labels


def compare(
    results_paths: Sequence[str | Path],
    ks: Sequence[int] | str | None = None,
    out_png: str | Path | None = None,
    labels: Sequence[str] | None = None,
) -> str:
    """Return a side-by-side table (one column per run) and optionally write the overlaid pass@k plot.

    Rows: benchmark, model, problems, n, pass@k (%) for each k (default 1, 2, 4, ... up to the largest n),
    avg@n (%), maj@n (%), token entropy (nats), mean completion tokens, solution multiplicity and the
    diversity among correct solutions (distinct-1/2, self-BLEU, semantic cosine). ``-`` = not available
    (e.g. k larger than that run's n).

    Raises:
        EvalError: a file is missing or is not a ``results.json``; a bad k.
    """
    from exploration_trl.eval.results import load_results
    from exploration_trl.metrics import parse_ks, pass_at_k_curve

    if isinstance(results_paths, (str, Path)):
        results_paths = [results_paths]
    if not results_paths:
        raise EvalError("compare: give at least one results.json")
    runs = [load_results(p) for p in results_paths]
    n_mins = [min(int(p["n"]) for p in r["problems"]) for r in runs]
    ks = parse_ks(ks, max(n_mins), error=EvalError, empty="k values must be positive integers",
                  too_small="k values must be positive integers",
                  too_large="k={k} exceeds the number of samples of every run (largest n = {n})")
    labels = list(labels) if labels is not None else _labels(runs)
    if len(labels) != len(runs):
        raise EvalError(f"{len(labels)} labels for {len(runs)} results")

    columns: list[dict[str, str]] = []
    for run, n_min in zip(runs, n_mins):
        problems = run["problems"]
        ns = [int(p["n"]) for p in problems]
        cs = [int(p["c"]) for p in problems]
        valid = [k for k in ks if k <= n_min]
        curve = pass_at_k_curve(ns, cs, valid) if valid else {}
        summary = run.get("summary") or {}
        div = summary.get("diversity_correct") or {}
        mult = summary.get("solution_multiplicity") or {}
        bench = run.get("benchmark")
        col = {
            "benchmark": str(bench.get("name") if isinstance(bench, dict) else (bench or "-")),
            "model": Path(str(run.get("model", "-"))).name or "-",
            "problems": str(len(problems)),
            "n": str(n_min) if len(set(ns)) == 1 else f"{n_min}-{max(ns)}",
        }
        for k in ks:
            col[f"pass@{k} (%)"] = _fmt(curve.get(k), pct=True)
        col["avg@n (%)"] = _fmt(sum(cs) / sum(ns), pct=True)
        col["maj@n (%)"] = _fmt(summary.get("maj_at_n"), pct=True)
        col["token entropy"] = _fmt(summary.get("token_entropy"))
        col["mean tokens"] = _fmt(summary.get("mean_completion_tokens"), digits=1)
        col["solution multiplicity"] = _fmt(mult.get("mean") if isinstance(mult, dict) else mult, digits=2)
        col["distinct-1 (correct)"] = _fmt(div.get("distinct_1"))
        col["distinct-2 (correct)"] = _fmt(div.get("distinct_2"))
        col["self-BLEU (correct)"] = _fmt(div.get("self_bleu"), digits=2)
        col["semantic cos (correct)"] = _fmt(div.get("semantic_cosine"))
        columns.append(col)

    metrics = list(columns[0])
    table = format_table(["metric", *labels], [[m, *(c[m] for c in columns)] for m in metrics])
    if out_png is not None:
        from exploration_trl.eval.plots import plot_pass_at_k

        plot_pass_at_k(runs, out_png, labels=labels, ks=ks)
        table += f"\n\npass@k plot: {out_png}"
    return table


#: Alias exported as ``exploration_trl.eval.compare_results`` (``exploration_trl.eval.compare`` is this module).
compare_results = compare

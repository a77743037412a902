"""The tree's report: per-method summaries over seeds, the markdown table and the per-run mass plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ... import _common
from .task import MODE_THRESHOLD, TreeTask


def summarise(task: TreeTask, runs: list[dict]) -> dict[str, dict[str, Any]]:
    """Per method: mean and std over seeds of accuracy, modes covered, entropy and each rewarding sequence's mass."""
    out: dict[str, dict[str, Any]] = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        rs = [r["final"] for r in runs if r["method"] == method]
        entry: dict[str, Any] = {"num_seeds": len(rs)}
        for key in ("accuracy", "modes_covered", "entropy", "top_mass"):
            m, s = _common.mean_std([x[key] for x in rs])
            entry[key] = {"mean": m, "std": s, "per_seed": [x[key] for x in rs]}
        largest = [max(x["mass"].values()) for x in rs]
        m, s = _common.mean_std(largest)
        entry["largest_mode"] = {"mean": m, "std": s, "per_seed": largest}
        entry["mass"] = {}
        for seq in task.rewarding:
            m, s = _common.mean_std([x["mass"][seq] for x in rs])
            entry["mass"][seq] = {"mean": m, "std": s}
        entry["seconds"] = sum(r["seconds"] for r in runs if r["method"] == method)
        out[method] = entry
    return out


def format_table(task: TreeTask, summary: dict[str, dict[str, Any]], init: dict[str, Any] | None = None) -> str:
    """Markdown table: one row per method (mean ± std over seeds), masses in percent."""
    header = ["method", "accuracy", "modes (>=1%)", "entropy (nats)", "largest mode %", *task.rewarding]
    rows = []
    if init is not None:
        rows.append(["(initial policy)", _common.fmt_pm(init["accuracy"]), _common.fmt_pm(init["modes_covered"], 2),
                     _common.fmt_pm(init["entropy"], 2), _common.fmt_pm(init["largest"], 1, 100),
                     *[_common.fmt_pm(init["mass"][s], 1, 100) for s in task.rewarding]])
    for method, e in summary.items():
        per = lambda key: e[key]["per_seed"]  # noqa: E731
        rows.append([method, _common.fmt_pm(per("accuracy")), _common.fmt_pm(per("modes_covered"), 2),
                     _common.fmt_pm(per("entropy"), 2), _common.fmt_pm(per("largest_mode"), 1, 100),
                     *[_fmt_mass(e["mass"][s], e["num_seeds"]) for s in task.rewarding]])
    return _common.markdown_table(header, rows)


def _fmt_mass(m: dict, n: int) -> str:
    return f"{100 * m['mean']:.1f} ± {100 * m['std']:.1f}" if n > 1 else f"{100 * m['mean']:.1f}"


def _init_stats(runs: list[dict]) -> dict[str, Any]:
    inits = [r["init"] for r in runs]
    seen, uniq = set(), []
    for r in runs:  # one initial policy per seed (every method of a seed starts from it)
        if r["seed"] not in seen:
            seen.add(r["seed"])
            uniq.append(r["init"])
    inits = uniq or inits
    return {
        "accuracy": [x["accuracy"] for x in inits],
        "modes_covered": [x["modes_covered"] for x in inits],
        "entropy": [x["entropy"] for x in inits],
        "mass": {s: [x["mass"][s] for x in inits] for s in inits[0]["mass"]},
        "largest": [max(x["mass"].values()) for x in inits],
    }


def plot_tree(task: TreeTask, runs: list[dict], out_png: str | Path, title: str | None = None) -> Path:
    """One panel per (method, seed): final mass of every rewarding sequence plus the non-rewarding total, as CaSP
    Fig. 5(b-d). Rows are methods, columns seeds (averaging masses over seeds would hide which mode each run kept)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in runs))
    seeds = list(dict.fromkeys(r["seed"] for r in runs))
    labels = list(task.rewarding) + ["other"]
    colors = ["tab:green"] * len(task.rewarding) + ["tab:red"]
    nrows, ncols = len(methods), len(seeds)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.9 * ncols + 0.6, 1.75 * nrows + 0.8), squeeze=False,
                             sharey=True, sharex=True)
    try:
        for i, method in enumerate(methods):
            for j, seed in enumerate(seeds):
                ax = axes[i][j]
                run = next((r for r in runs if r["method"] == method and r["seed"] == seed), None)
                if run is None:
                    ax.axis("off")
                    continue
                f = run["final"]
                vals = [f["mass"][s] for s in task.rewarding] + [f["non_rewarding_mass"]]
                ax.bar(range(len(labels)), vals, color=colors, alpha=0.8)
                ax.set_ylim(0, 1)
                ax.axhline(MODE_THRESHOLD, color="grey", linewidth=0.6, linestyle=":")
                ax.grid(True, axis="y", alpha=0.3)
                ax.set_title(f"{method} s{seed}: acc {f['accuracy']:.2f}, modes {f['modes_covered']}", fontsize=8)
                ax.tick_params(labelsize=7)
            axes[i][0].set_ylabel("mass", fontsize=8)
        for ax in axes[-1]:
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=45, fontsize=7)
        fig.suptitle(title or f"Tree (|A|={len(task.actions)}, H={task.horizon}): exact final mass of each rewarding "
                     "sequence (green) and of all others (red)", fontsize=9)
        fig.tight_layout()
        return _common.save_figure(fig, out_png, dpi=110)
    finally:
        plt.close(fig)

"""The budget experiment's figure: the four held-out metrics against steps, and the (pass@1, pass@64) plane with
each setting's trajectory over GRPO's (means over the RL seeds that ran; error bars: seed standard errors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import _common, curves_rule

PANELS = (("pass@1", "held-out pass@1 %", 100.0), ("pass@64", "held-out pass@n %", 100.0),
          ("distinct_correct", "distinct correct / problem", 1.0), ("token_entropy", "token entropy (nats)", 1.0))


def _means(rows: list[dict], key: str) -> tuple[list[int], list[float], list[float]]:
    by_step: dict[int, list[float]] = {}
    for r in rows:
        if r.get(key) is not None:
            by_step.setdefault(int(r["step"]), []).append(float(r[key]))
    steps = sorted(by_step)
    stats = [curves_rule.mean_se(by_step[s]) for s in steps]
    return steps, [m for m, _ in stats], [se or 0.0 for _, se in stats]


def plot_curves(data: dict[str, Any], out_png: Path) -> Path | None:
    rows = data.get("rows") or []
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(r["label"] for r in rows))
    others = [lb for lb in labels if lb != "grpo"]
    palette = plt.cm.tab10 if len(others) <= 10 else plt.cm.tab20
    colors = {lb: palette(i % palette.N) for i, lb in enumerate(others)}
    colors["grpo"] = "black"
    fig, axes = plt.subplots(1, 5, figsize=(24, 4.6))
    try:
        for ax, (key, title, scale) in zip(axes[:4], PANELS):
            for lb in labels:
                xs, ys, es = _means([r for r in rows if r["label"] == lb], key)
                bold = lb == "grpo"
                ax.errorbar(xs, [scale * y for y in ys], yerr=[scale * e for e in es], label=lb, color=colors[lb],
                            linewidth=2.6 if bold else 1.2, marker="o", markersize=3, capsize=2)
            ax.set_title(title)
            if key == "token_entropy":
                ax.set_yscale("log")  # a diverging run climbs to ~4.5 nats; the others stay near 0.2-0.5
            ax.set_xlabel("RL step")
            ax.grid(True, alpha=0.3)
        ax = axes[4]
        collapsed = []
        for lb in labels:
            # A checkpoint that solves nothing (a diverged run) would squash every other trajectory into a corner.
            full = curves_rule.trajectory([r for r in rows if r["label"] == lb])
            t = [p for p in full if p[2] > 0]
            if len(t) < len(full):
                collapsed.append(lb)
            if not t:
                continue
            bold = lb == "grpo"
            ax.plot([100 * p[1] for p in t], [100 * p[2] for p in t], marker="o", markersize=3, color=colors[lb],
                    linewidth=3.0 if bold else 1.2, label=lb, zorder=3 if bold else 2)
            ax.annotate(str(t[-1][0]), (100 * t[-1][1], 100 * t[-1][2]), fontsize=7, color=colors[lb])
        ax.set_xlabel("held-out pass@1 %")
        ax.set_ylabel("held-out pass@n %")
        ax.set_title("trajectories (GRPO bold; last step labelled)" +
                     (f"\nnot shown: checkpoints with pass@n 0 ({', '.join(collapsed)})" if collapsed else ""),
                     fontsize=9 if collapsed else None)
        ax.grid(True, alpha=0.3)
        axes[0].legend(fontsize=7, loc="best")
        seeds = sorted({r["seed"] for r in rows})
        fig.suptitle(f"countdown-tiny over a training budget: {len(labels)} settings, RL seeds {seeds}, "
                     f"{data.get('num_problems')} held-out problems x {data.get('n_samples')} samples", fontsize=10)
        fig.tight_layout()
        return _common.save_figure(fig, out_png)
    finally:
        plt.close(fig)

"""Training curves for a card: mean reward and token entropy per logged step, and the held-out pass@k when the
trainer evaluated it (`trainers/components/heldout_eval.py`), from the trainer's log history."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from exploration_trl.eval.results import write_atomic

__all__ = ["CURVES_FILE", "card_curves", "heldout_keys", "history_from_folder", "plot_training_curves", "training_summary"]

CURVES_FILE = "training_curves.png"


def history_from_folder(output_dir: Path) -> list[dict] | None:
    """`log_history` of `trainer_state.json` in the folder, else of its newest `checkpoint-*`."""
    candidates = [output_dir / "trainer_state.json"]
    ckpts = sorted(
        (p for p in output_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
        key=lambda p: int(p.name.split("-")[-1]),
        reverse=True,
    )
    candidates += [c / "trainer_state.json" for c in ckpts]
    for path in candidates:
        if path.is_file():
            try:
                history = json.loads(path.read_text(encoding="utf-8")).get("log_history")
            except (OSError, json.JSONDecodeError, AttributeError):
                continue
            if history:
                return history
    return None


def _series(log_history: Iterable[Mapping], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, entry in enumerate(log_history or []):
        v = entry.get(key) if isinstance(entry, Mapping) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(float(entry.get("step", i)))
            ys.append(float(v))
    return xs, ys


def plot_training_curves(log_history: Sequence[Mapping] | None, out: str | Path | None = None) -> bytes | None:
    """PNG of the mean reward (± its std across completions when logged) and the token entropy per logged step.

    Returns the PNG bytes (also written to `out` when given), or `None` when `log_history` has neither metric.
    """
    rx, ry = _series(log_history, "reward")
    ex, ey = _series(log_history, "entropy")
    heldout = {k: _series(log_history, k) for k in heldout_keys(log_history)}
    if not ry and not ey and not heldout:
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 3 if heldout else 2, figsize=(14.4 if heldout else 9.6, 3.6))
    try:
        if heldout:  # held-out pass@k of `trainers/components/heldout_eval.py`, with its 95% interval
            ax = axes[2]
            for key, (xs, ys) in heldout.items():
                ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.6, label=key.removeprefix("eval_"))
                _, lo = _series(log_history, f"{key}_ci_low")
                _, hi = _series(log_history, f"{key}_ci_high")
                if len(lo) == len(ys) == len(hi):
                    ax.fill_between(xs, lo, hi, alpha=0.15, linewidth=0)
            ax.set_title("held-out pass@k")
            ax.set_xlabel("step")
            ax.legend(fontsize=8)
            ax.grid(True, alpha=0.3)
        for ax, xs, ys, title, color in ((axes[0], rx, ry, "mean reward", "tab:blue"),
                                         (axes[1], ex, ey, "token entropy (nats)", "tab:orange")):
            if ys:
                ax.plot(xs, ys, marker="o" if len(ys) < 30 else None, markersize=3, linewidth=1.6, color=color)
                if title == "mean reward":
                    sx, sy = _series(log_history, "reward_std")
                    if sy and sx == xs:
                        ax.fill_between(xs, [y - s for y, s in zip(ys, sy)], [y + s for y, s in zip(ys, sy)],
                                        alpha=0.15, color=color, linewidth=0)
            else:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(True, alpha=0.3)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    finally:
        plt.close(fig)
    data = buf.getvalue()
    if out is not None:
        write_atomic(Path(out), data)
    return data


def heldout_keys(log_history: Iterable[Mapping] | None) -> list[str]:
    """The held-out pass@k keys (`eval_pass@k`, without their interval bounds) in the history, by k."""
    keys = {k for e in log_history or [] if isinstance(e, Mapping) for k in e
            if str(k).startswith("eval_pass@") and str(k)[len("eval_pass@"):].isdigit()}
    return sorted(keys, key=lambda k: int(k[len("eval_pass@"):]))


def _step(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def training_summary(log_history: Sequence[Mapping] | None, final: Mapping[int, float] | None = None) -> str | None:
    """One sentence: the mean reward, token entropy and held-out pass@k (in %, as in the card's table) at the first
    and at the last step each was logged, every value with its step.

    Each quantity names its own steps because they differ: held-out pass@k is logged only on evaluation steps, so
    "first → last logged step" of the run would misdate it. `final` (`{k: pass@k}`) is the final evaluation of the
    trained model on the held-out benchmark (the card's table's row): each held-out pass@k it has goes on to it, at
    the last step of training, so the sentence ends where the table does."""
    entries = [e for e in log_history or [] if isinstance(e, Mapping) and isinstance(e.get("step"), (int, float))
               and not isinstance(e.get("step"), bool)]
    if not entries:
        return None
    last = max(float(e["step"]) for e in entries)
    parts = []
    for key, label, fmt in (("reward", "mean reward", lambda v: f"{v:.3g}"),
                            ("entropy", "token entropy", lambda v: f"{v:.3g} nats"),
                            *((k, f"held-out {k.removeprefix('eval_')}", lambda v: f"{100 * v:.1f}%")
                              for k in heldout_keys(entries))):
        xs, ys = _series(entries, key)
        if len(ys) >= 2:
            part = f"{label} {fmt(ys[0])} at step {_step(xs[0])} → {fmt(ys[-1])} at step {_step(xs[-1])}"
        elif ys:
            part = f"{label} {fmt(ys[0])} at step {_step(xs[0])}"
        else:
            continue
        k = int(key[len("eval_pass@"):]) if key.startswith("eval_pass@") else None
        if k is not None and final and final.get(k) is not None:
            part += f" → {fmt(float(final[k]))} at step {_step(last)} (final evaluation)"
        parts.append(part)
    if not parts:
        return None
    return f"During training ({_step(last)} steps): " + "; ".join(parts) + "."


def card_curves(
    output_dir: Path, log_history: Sequence[Mapping] | None, recorded_summary: str | None,
    final: Mapping[int, float] | None = None,
) -> tuple[bytes | None, str | None, str | None]:
    """`(png to write or None, link for the card or None, training summary)`: from `log_history`, else from
    `trainer_state.json` in the folder; without either, a PNG already in the folder and the recorded summary.
    `final`: the held-out benchmark's final pass@k (see `training_summary`)."""
    history = log_history if log_history is not None else history_from_folder(output_dir)
    if history:
        png = plot_training_curves(history)
        return png, CURVES_FILE if png is not None else None, training_summary(history, final)
    return None, CURVES_FILE if (output_dir / CURVES_FILE).is_file() else None, recorded_summary

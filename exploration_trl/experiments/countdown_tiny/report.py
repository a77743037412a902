"""Countdown-tiny's report: the comparison table, the progress lines, the compact results and the pass@k plot."""

from __future__ import annotations

from pathlib import Path

from .. import _common


def _row(name: str, res: dict, ks: list[int], seconds: float | None) -> list[str]:
    s = res["summary"]
    pk = s["pass_at_k"]
    mult = s.get("solution_multiplicity") or {}
    cells = [name] + [f"{100 * pk[str(k)]:.1f}" if str(k) in pk else "-" for k in ks]
    ent = s.get("token_entropy")
    cells += [f"{ent:.3f}" if ent is not None else "-",
              f"{mult['mean']:.2f}" if mult.get("mean") is not None else "-",
              f"{mult['mean_solved']:.2f}" if mult.get("mean_solved") is not None else "-",
              f"{seconds:.0f}" if seconds is not None else "-"]
    return cells


def format_table(runs: dict[str, dict], n: int) -> str:
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= n] + ([n] if n not in (1, 2, 4, 8, 16, 32, 64) else [])
    header = ["model"] + [f"pass@{k} %" for k in ks] + ["entropy (nats/token)", "distinct correct / problem",
                                                        "distinct correct / solved problem", "RL seconds"]
    rows = [_row(name, r["eval"], ks, r.get("rl", {}).get("seconds")) for name, r in runs.items()]
    return _common.markdown_table(header, rows)


def _compact(run: dict) -> dict:
    s = run["eval"]["summary"]
    return {
        "pass_at_k": {k: v for k, v in s["pass_at_k"].items()},
        "token_entropy": s.get("token_entropy"),
        "token_entropy_correct": s.get("token_entropy_correct"),
        "token_entropy_wrong": s.get("token_entropy_wrong"),
        "solution_multiplicity": s.get("solution_multiplicity"),
        "mean_completion_tokens": s.get("mean_completion_tokens"),
        "truncated_fraction": s.get("truncated_fraction"),
        "num_problems": s.get("num_problems"),
        "n": s.get("n"),
        "rl": run.get("rl"),
        "eval_seconds": run.get("eval_seconds"),
        "cpu_seconds": run.get("cpu_seconds"),
        "results_file": run["eval"].get("path"),
    }


def log_eval(log, name, res, seconds=None, prefix="countdown-tiny"):
    """One progress line: a model's held-out pass@1 and pass@n (and its RL seconds)."""
    pk = res["summary"]["pass_at_k"]
    n = max(int(k) for k in pk)
    extra = f" (RL {seconds:.0f}s)" if seconds is not None else ""
    log(f"[{prefix}] {name:>14s}: pass@1 {100 * pk['1']:.1f}%, pass@{n} {100 * pk[str(n)]:.1f}%{extra}")


def _plot(runs: dict[str, dict], out_png: Path) -> Path | None:
    from ...eval.plots import plot_pass_at_k

    return plot_pass_at_k([r["eval"] for r in runs.values()], out_png, labels=list(runs),
                          title="countdown-tiny: pass@k on held-out problems")

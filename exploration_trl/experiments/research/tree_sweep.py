"""`exploration-trl tree --sweep`: every method over a grid of its strengths, and its accuracy-modes frontier.

Coefficients tuned for 2,000-token LLM responses have little to act on in a 3-token tree, so each method is trained
at its published setting *and* at strengths spanning at least 100x around it (`TREE_GRID`), over the given seeds,
with the same budget as `tree`. Writes, in `--output-dir`:

* `frontier.json`: `{"rows": [{"method", "setting", "seeds", "accuracy", "modes_covered", "entropy",
  "largest_mode"}, ...]}` (each metric `{"mean", "std"}` over seeds; the initial policy is the row
  `initial_policy`), the shape outside scripts read;
* `frontier.png`: accuracy against modes covered, a line per method through its settings;
* `sweep.json`: everything else (per-seed runs, task, budget, selection rules and their outcome, runtimes);
* `best_settings.yaml`: a `--grid` file with GRPO, each method's best setting and the entropy bonus's grid, to
  re-run them on the other policy (`tree --policy lm --sweep --grid best_settings.yaml`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import _common
from . import frontier
from .frontier import grid
from .tree.task import TreeTask
from .tree.train import DEFAULT_SWEEP_SEEDS, QUICK_SWEEP_SEEDS, TrainSettings, train_one

#: The default grid. Published settings: CaSP alpha 0.01, tau 0.8, N 3, lambda 1.1; ProGRPO alpha 0.3; DS-GRPO
#: gamma_p = gamma_n = 0.01 (token granularity by default); KL-Cov ratio 0.002, coef 1; Clip-Cov ratio 2e-4.
#: The entropy bonus has no paper value; 0.01 is the usual LLM coefficient. With 3 tokens per response the CaSP
#: quantile has two regimes that fork at all (tau < 0.5: 2 tokens fork, 0.5 <= tau < 1: 1 token), hence 0.4 and 0.8.
#: KL-Cov: with 48 tokens per micro-batch, ratios 0.002 and 0.02 both select 1 token (k = max(1, int(48 * ratio))).
#: `frontier.MECHANISM_OFF` adds KL-Cov and Clip-Cov with their schedule but without their token selection.
TREE_GRID: list[frontier.Point] = frontier.unique([
    ("grpo", {}),
    *grid("grpo_entropy", entropy_coef=[0.01, 0.03, 0.1, 0.3, 1.0]),
    *grid("casp", casp_alpha=[0.001, 0.01, 0.1, 0.3, 1.0], casp_entropy_quantile=[0.8, 0.4], casp_top_n=[3],
          casp_top1_penalty=[1.1]),
    *grid("casp", casp_alpha=[0.3], casp_entropy_quantile=[0.8, 0.4], casp_top_n=[1, 2, 4], casp_top1_penalty=[1.1]),
    *grid("casp", casp_alpha=[0.01], casp_entropy_quantile=[0.8], casp_top_n=[3], casp_top1_penalty=[1.0, 1.5, 2.0, 3.0]),
    *grid("casp", casp_alpha=[0.3], casp_entropy_quantile=[0.4], casp_top_n=[3], casp_top1_penalty=[1.0, 1.5, 2.0, 3.0]),
    *grid("progrpo", progrpo_alpha=[0.03, 0.1, 0.3, 1.0, 3.0]),
    *[p for p in grid("dsgrpo", ds_gamma_p=[0.0, 0.01, 0.1, 1.0], ds_gamma_n=[0.0, 0.01, 0.1, 1.0],
                      ds_logp_granularity=["token"]) if p[1]["ds_gamma_p"] or p[1]["ds_gamma_n"]],
    *[("dsgrpo", {"ds_gamma_p": g, "ds_gamma_n": g, "ds_logp_granularity": gran})
      for gran in ("sequence_mean", "sequence_sum") for g in (0.01, 0.1, 1.0)],
    *grid("kl_cov", kl_cov_ratio=[0.002, 0.02, 0.2, 0.5], kl_cov_coef=[0.1, 1.0, 10.0]),
    *grid("clip_cov", clip_cov_ratio=[2e-4, 2e-3, 2e-2, 0.2]),
    *frontier.MECHANISM_OFF,
])

#: `--quick`: one point per method (two for the entropy bonus, so it draws a line).
QUICK_GRID: list[frontier.Point] = [
    ("grpo", {}),
    *grid("grpo_entropy", entropy_coef=[0.01, 0.3]),
    ("casp", {"casp_alpha": 0.3, "casp_entropy_quantile": 0.4}),
    ("progrpo", {"progrpo_alpha": 1.0}),
    ("dsgrpo", {"ds_gamma_p": 0.1, "ds_gamma_n": 0.1, "ds_logp_granularity": "token"}),
    ("kl_cov", {"kl_cov_ratio": 0.2, "kl_cov_coef": 1.0}),
    ("clip_cov", {"clip_cov_ratio": 0.02}),
]

#: Selection rules, fixed before the first sweep: a setting is eligible when its mean accuracy is at least GRPO's
#: minus `ACCURACY_TOLERANCE`; a method's best setting is its eligible one with the most modes covered (then the
#: highest entropy); it beats the entropy bonus when it covers more than `MODES_MARGIN` modes more than every
#: entropy-bonus setting (GRPO included) that is at least as accurate.
ACCURACY_TOLERANCE = 0.02
MODES_MARGIN = 0.5
METRICS = ("accuracy", "modes_covered", "entropy", "largest_mode")
DIVERSITY = ("modes_covered", "entropy")
#: Table columns: (metric, header, digits, scale).
COLUMNS = [("accuracy", "accuracy", 3, 1.0), ("modes_covered", "modes (>=1%)", 2, 1.0),
           ("entropy", "entropy (nats)", 2, 1.0), ("largest_mode", "largest mode %", 1, 100.0)]
#: Config-field prefixes dropped in labels (`casp_alpha=0.1` -> `alpha=0.1`).


def sweep_job(task: TreeTask, method: str, setting: dict[str, Any], seed: int, settings: TrainSettings,
              output_dir: Path, base_overrides: dict[str, Any] | None) -> dict[str, Any]:
    """One (method, setting, seed) run, reduced to what the frontier needs (a job for `_common.run_jobs`)."""
    run = train_one(task, method, seed, settings, output_dir, {**(base_overrides or {}), **setting})
    return {"method": method, "setting": setting, "seed": seed, **_metrics(run["final"]), "init": _metrics(run["init"]),
            "seconds": run["seconds"], "cpu_seconds": run["cpu_seconds"],
            "invalid_completions": run["invalid_completions"], "train_metrics": run["train_metrics"]}


def _metrics(state: Mapping[str, Any]) -> dict[str, Any]:
    return {"accuracy": state["accuracy"], "modes_covered": state["modes_covered"], "entropy": state["entropy"],
            "largest_mode": max(state["mass"].values()), "mass": dict(state["mass"])}


def initial_row(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The initial policy as a frontier row (one initial policy per seed)."""
    per_seed = {r["seed"]: r["init"] for r in runs}
    rows = frontier.aggregate([{"method": frontier.INITIAL, "setting": {}, "seed": s, **m} for s, m in per_seed.items()],
                              METRICS)
    return rows[0]


def run_sweep(task: TreeTask, points: Sequence[frontier.Point], seeds: Sequence[int],
              settings: TrainSettings, output: str | Path, overrides: dict[str, dict[str, Any]] | None = None,
              plot: bool = True, workers: int = 1, threads: int | None = 1, log=print) -> dict[str, Any]:
    """Train every grid point over `seeds`; write frontier.json/.png, sweep.json and best_settings.yaml."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    jobs = [(task, method, dict(setting), seed, settings, output / "runs" / f"p{i:03d}", (overrides or {}).get(method))
            for i, (method, setting) in enumerate(points) for seed in seeds]
    done = [0]

    def report(r):
        done[0] += 1
        log(f"[tree sweep] {done[0]}/{len(jobs)} {r['method']} {frontier.setting_label(r['setting'])} "
            f"seed {r['seed']}: accuracy {r['accuracy']:.3f}, modes {r['modes_covered']} ({r['seconds']:.1f}s)")

    log(f"[tree sweep] {len(points)} settings x {len(seeds)} seeds = {len(jobs)} runs, {settings.policy} policy, "
        f"{workers} worker(s)")
    with _common.Timer() as total:
        runs = _common.run_jobs(sweep_job, jobs, workers=workers, threads=threads, on_result=report)
    rows = [initial_row(runs), *frontier.aggregate(runs, METRICS)]
    found = frontier.findings(rows, "accuracy", DIVERSITY, ACCURACY_TOLERANCE, MODES_MARGIN)
    frontier.write_frontier(output / "frontier.json", rows)
    result = {
        "experiment": "tree-sweep",
        "task": task.describe(),
        "settings": {**settings.describe(), "seeds": list(seeds), "workers": workers, "threads_per_worker": threads,
                     "overrides": overrides or {}},
        "grid": [{"method": m, "setting": s} for m, s in points],
        "rows": rows,
        "findings": found,
        "table": frontier.format_table(rows, COLUMNS),
        "findings_table": frontier.format_findings(found, COLUMNS),
        "runs": runs,
        "seconds_total": total.seconds,
        "cpu_seconds_runs": sum(r["cpu_seconds"] for r in runs),
        "environment": _common.environment(),
    }
    if plot:
        result["plot"] = str(frontier.plot_frontier(
            rows, "modes_covered", "accuracy", output / "frontier.png", xlabel="rewarding sequences with >= 1% mass",
            ylabel="accuracy (mass on rewarding sequences)", floor=found.get("rule", {}).get("floor"),
            zoom_margin=ACCURACY_TOLERANCE,
            title=f"Tree, {settings.policy} policy: accuracy vs modes covered "
                  f"(mean ± std over {len(seeds)} seed{'s' * (len(seeds) > 1)}, {settings.steps} steps)"))
    _common.write_json(output / "sweep.json", result)
    write_best_settings(output / "best_settings.yaml", found, points)
    return result


def write_best_settings(path: Path, found: Mapping[str, Any], points: Sequence[frontier.Point]) -> Path:
    """A `--grid` file: GRPO, each method's published and best settings, and the entropy bonus's whole grid (the
    comparison at equal accuracy)."""
    import yaml

    best = frontier.best_points(found)
    best[frontier.ENTROPY_BONUS] = [dict(s) for m, s in points if m == frontier.ENTROPY_BONUS]
    best = {m: v for m, v in best.items() if v}
    header = ("# Written by `exploration-trl tree --sweep`: GRPO, each method's published and best setting (most modes\n"
              "# covered at accuracy within the tolerance of GRPO's) and the entropy bonus's grid. Re-run with --grid.\n")
    from ...io_safety import write_atomic

    write_atomic(path, header + yaml.safe_dump(best, sort_keys=False))
    return path


def main_sweep(args, task: TreeTask, settings: TrainSettings) -> int:
    if args.trace_every:
        raise ValueError("--trace-every does not apply to --sweep; drop it")
    points, methods = frontier.sweep_points(args, TREE_GRID, QUICK_GRID)
    seeds = _common.parse_int_list(args.seeds or (QUICK_SWEEP_SEEDS if args.quick else DEFAULT_SWEEP_SEEDS),
                                   "--seeds")
    overrides = _common.load_overrides(args.config, methods)
    output = Path(args.output or "runs/tree_sweep")
    result = run_sweep(task, points, seeds, settings, output, overrides, plot=not args.no_plot,
                       workers=args.workers, threads=args.threads)
    rule = result["findings"].get("rule", {})
    frontier.print_summary(
        f"Tree sweep ({settings.policy} policy): {len(points)} settings x seeds {','.join(map(str, seeds))}, "
        f"{settings.steps} steps x {settings.num_generations} completions", result,
        f"most modes covered with accuracy >= {rule.get('floor', float('nan')):.3f} (GRPO - {ACCURACY_TOLERANCE}); "
        f"beats the entropy bonus: > {MODES_MARGIN} modes more than every entropy-bonus setting at least as accurate",
        f"wrote {output / 'frontier.json'}" + (f", {result['plot']}" if result.get("plot") else "")
        + f", sweep.json and best_settings.yaml in {result['seconds_total']:.0f}s")
    return 0

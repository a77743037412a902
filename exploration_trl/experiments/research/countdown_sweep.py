"""`exploration-trl countdown-tiny --sweep`: every method over a grid of its strengths, from one SFT warm start.

The frontier here is pass@1 (accuracy) against pass@k with k = `--n-samples` (64 by default; diversity that
solves problems) and distinct correct equations per problem, on the held-out problems. Every grid point is one RL
run per `--rl-seeds` seed from the same cached warm start, with the experiment's RL budget. Writes, in `--output-dir`:

* `frontier.json`: `{"rows": [{"method", "setting", "seeds", "k", "pass_at_1", "pass_at_k", "distinct_correct",
  "entropy"}, ...]}` (metrics `{"mean", "std"}` over RL seeds; the warm start is the row `initial_policy`);
* `frontier.png`: pass@1 against pass@k, a line per method through its settings;
* `sweep.json`: everything else (per-seed runs, settings, selection rules and their outcome, runtimes).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .. import _common
from . import frontier
from ..countdown_tiny.rl import prepare, rl_and_eval
from ..countdown_tiny.task import Settings
from .frontier import grid

#: The default grid (published settings as in `tree_sweep.TREE_GRID`; strengths span >= 100x around them). Smaller
#: than the tree's: one RL run here costs about 40 tree runs. With ~1,000 completion tokens per micro-batch (128
#: completions of ~8 tokens), Clip-Cov ratio 2e-4 cuts at most 1 token and KL-Cov 0.002 selects ~2.
#: `frontier.MECHANISM_OFF` adds KL-Cov and Clip-Cov with their schedule but without their token selection.
COUNTDOWN_GRID: list[frontier.Point] = frontier.unique([
    ("grpo", {}),
    *grid("grpo_entropy", entropy_coef=[0.001, 0.01, 0.03, 0.1]),
    *grid("casp", casp_alpha=[0.001, 0.01, 0.1, 1.0], casp_entropy_quantile=[0.8], casp_top_n=[3],
          casp_top1_penalty=[1.1]),
    *grid("casp", casp_alpha=[0.1], casp_entropy_quantile=[0.5], casp_top_n=[3], casp_top1_penalty=[1.1]),
    *grid("casp", casp_alpha=[0.1], casp_entropy_quantile=[0.8], casp_top_n=[10], casp_top1_penalty=[1.1]),
    *grid("casp", casp_alpha=[0.01], casp_entropy_quantile=[0.8], casp_top_n=[3], casp_top1_penalty=[1.0, 2.0]),
    *grid("progrpo", progrpo_alpha=[0.03, 0.3, 3.0]),
    *[("dsgrpo", {"ds_gamma_p": p, "ds_gamma_n": n, "ds_logp_granularity": "token"})
      for p, n in ((0.01, 0.01), (0.1, 0.1), (1.0, 1.0), (0.1, 0.0), (0.0, 0.1))],
    *[("dsgrpo", {"ds_gamma_p": g, "ds_gamma_n": g, "ds_logp_granularity": gran})
      for gran, gammas in (("sequence_mean", (0.01, 1.0)), ("sequence_sum", (0.01, 0.1))) for g in gammas],
    *grid("kl_cov", kl_cov_ratio=[0.002, 0.02, 0.2], kl_cov_coef=[1.0]),
    *grid("kl_cov", kl_cov_ratio=[0.02], kl_cov_coef=[0.1, 10.0]),
    *grid("clip_cov", clip_cov_ratio=[2e-4, 2e-3, 2e-2]),
    *frontier.MECHANISM_OFF,
])

#: `--quick`: one point per method, two for the entropy bonus.
QUICK_GRID: list[frontier.Point] = [
    ("grpo", {}),
    *grid("grpo_entropy", entropy_coef=[0.01, 0.1]),
    ("casp", {"casp_alpha": 0.1}),
    ("progrpo", {"progrpo_alpha": 0.3}),
    ("dsgrpo", {"ds_gamma_p": 0.1, "ds_gamma_n": 0.1}),
    ("kl_cov", {"kl_cov_ratio": 0.02}),
    ("clip_cov", {"clip_cov_ratio": 2e-3}),
]

#: Selection rules, fixed before the first sweep: eligible when mean pass@1 >= GRPO's - `PASS1_TOLERANCE`; the best
#: setting has the highest pass@k (then distinct correct); it beats the entropy bonus when its pass@k exceeds that
#: of every entropy-bonus setting (GRPO included) with at least its pass@1 by more than `PASSK_MARGIN`.
PASS1_TOLERANCE = 0.01
PASSK_MARGIN = 0.01
METRICS = ("pass_at_1", "pass_at_k", "distinct_correct", "entropy")
DIVERSITY = ("pass_at_k", "distinct_correct")


def columns(k: int) -> list[tuple[str, str, int, float]]:
    return [("pass_at_1", "pass@1 %", 1, 100.0), ("pass_at_k", f"pass@{k} %", 1, 100.0),
            ("distinct_correct", "distinct correct / problem", 2, 1.0), ("entropy", "entropy (nats/token)", 3, 1.0)]


def _metrics(eval_result: dict[str, Any]) -> dict[str, Any]:
    s = eval_result["summary"]
    n = max(int(k) for k in s["pass_at_k"])
    return {"pass_at_1": s["pass_at_k"]["1"], "pass_at_k": s["pass_at_k"][str(n)], "k": n,
            "distinct_correct": (s.get("solution_multiplicity") or {}).get("mean"), "entropy": s.get("token_entropy")}


def sweep_job(method: str, setting: dict[str, Any], seed: int, settings: Settings, ckpt: Path,
              train: list[dict], bench, output: Path, name: str, base_overrides: dict[str, Any] | None) -> dict:
    """One (method, setting, RL seed) run reduced to its frontier metrics (a job for `_common.run_jobs`)."""
    seeded = replace(settings, rl=replace(settings.rl, seed=seed))
    r = rl_and_eval(method, seeded, ckpt, train, bench, output, {**(base_overrides or {}), **setting}, name=name)
    return {"method": method, "setting": setting, "seed": seed, **_metrics(r["eval"]), "rl": r["rl"],
            "eval_seconds": r["eval_seconds"], "cpu_seconds": r["cpu_seconds"]}


def run_sweep(points: list[frontier.Point], settings: Settings, rl_seeds: list[int], output: Path,
              cache_dir: Path, overrides: dict[str, dict] | None = None, plot: bool = True, workers: int = 1,
              threads: int | None = 1, log=print) -> dict[str, Any]:
    output = Path(output)
    with _common.Timer() as total:
        ws = prepare(settings, cache_dir, output, threads, log)
        jobs = [(m, dict(s), seed, settings, ws.checkpoint, ws.train, ws.bench, output, f"p{i:03d}_seed{seed}",
                 (overrides or {}).get(m)) for i, (m, s) in enumerate(points) for seed in rl_seeds]
        done = [0]

        def report(r):
            done[0] += 1
            log(f"[countdown sweep] {done[0]}/{len(jobs)} {r['method']} {frontier.setting_label(r['setting'])} "
                f"seed {r['seed']}: pass@1 {100 * r['pass_at_1']:.1f}%, pass@{r['k']} {100 * r['pass_at_k']:.1f}% "
                f"(RL {r['rl']['seconds']:.0f}s)")

        log(f"[countdown sweep] {len(points)} settings x {len(rl_seeds)} RL seed(s) = {len(jobs)} runs, "
            f"{workers} worker(s)")
        with _common.Timer() as t_rl:
            runs = _common.run_jobs(sweep_job, jobs, workers=workers, threads=threads, on_result=report)
    k = settings.eval.n_samples
    initial = {"method": frontier.INITIAL, "setting": {}, "seed": settings.seed, **_metrics(ws.eval)}
    rows = [{**row, "k": k} for row in frontier.aggregate([initial, *runs], METRICS)]
    found = frontier.findings(rows, "pass_at_1", DIVERSITY, PASS1_TOLERANCE, PASSK_MARGIN)
    frontier.write_frontier(output / "frontier.json", rows)
    cols = columns(k)
    result = {
        "experiment": "countdown-tiny-sweep",
        "settings": asdict(settings),
        "rl_seeds": list(rl_seeds),
        "overrides": overrides or {},
        **ws.describe(),
        "grid": [{"method": m, "setting": s} for m, s in points],
        "rows": rows,
        "findings": found,
        "table": frontier.format_table(rows, cols),
        "findings_table": frontier.format_findings(found, cols),
        "runs": runs,
        "seconds": {"total": total.seconds, "sft_this_run": ws.seconds, "rl_and_eval": t_rl.seconds},
        "cpu_seconds_runs": sum(r["cpu_seconds"] for r in runs),
        "workers": workers,
        "threads_per_worker": threads,
        "environment": _common.environment(),
    }
    if plot:
        result["plot"] = str(frontier.plot_frontier(
            rows, "pass_at_k", "pass_at_1", output / "frontier.png", scale=100.0,
            xlabel=f"pass@{k} on held-out problems (%)", ylabel="pass@1 on held-out problems (%)",
            floor=found.get("rule", {}).get("floor"), zoom_margin=5 * PASS1_TOLERANCE,
            title=f"countdown-tiny: pass@1 vs pass@{k}, {settings.rl.steps} RL steps per setting "
                  f"({len(rl_seeds)} RL seed{'s' * (len(rl_seeds) > 1)}); initial policy = the SFT warm start"))
    _common.write_json(output / "sweep.json", result)
    return result


def main_sweep(args, settings: Settings, cache_dir: Path) -> int:
    points, methods = frontier.sweep_points(args, COUNTDOWN_GRID, QUICK_GRID)
    rl_seeds = _common.parse_int_list(args.rl_seeds, "--rl-seeds") if args.rl_seeds else [settings.seed]
    overrides = _common.load_overrides(args.config, methods)
    output = Path(args.output or "runs/countdown_tiny_sweep")
    result = run_sweep(points, settings, rl_seeds, output, cache_dir, overrides, workers=args.workers,
                       threads=args.threads)
    k, rule = settings.eval.n_samples, result["findings"].get("rule", {})
    frontier.print_summary(
        f"countdown-tiny sweep: {len(points)} settings x RL seeds {','.join(map(str, rl_seeds))}, {settings.rl.steps} "
        f"RL steps each; {result['split']['num_test_evaluated']} held-out problems x {k} samples", result,
        f"highest pass@{k} with pass@1 >= {100 * rule.get('floor', float('nan')):.1f}% (GRPO - "
        f"{100 * PASS1_TOLERANCE:g} points); beats the entropy bonus: pass@{k} > {100 * PASSK_MARGIN:g} points above "
        "every entropy-bonus setting at least as accurate",
        f"wrote {output / 'frontier.json'}, {result.get('plot')} and sweep.json in {result['seconds']['total']:.0f}s")
    return 0

"""`exploration-trl countdown-tiny --curves`: where GRPO collapses over a long budget, does any method beat GRPO
stopped early?

Every setting trains from the shipped warm start (the demo's, `exploration_trl/data/warm_start/countdown_tiny`) on the
countdown-tiny training problems, and is evaluated on the held-out problems at the steps of `EVAL_STEPS` by the
trainer's held-out evaluation (`trainers/components/heldout_eval.py`): the checkpoints are evaluated as training goes,
not retrained. Each (setting, seed) run writes `<output>/runs/<label>__seed<s>.json` as soon as it ends, so an
interrupted experiment resumes where it stopped. The verdicts follow `curves_rule.py`, fixed before any run.

Outputs: `<output>/curves.json` (one row per method, setting, seed and step with pass@1, pass@64, distinct correct
per problem and token entropy; what ran; the verdicts) and `<output>/curves.png` (`curves_plot.py`).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path
from typing import Any

from .. import _common, curves_rule
from . import frontier
from ..countdown_tiny import rl as countdown_rl
from ..countdown_tiny import task as countdown_task
from ..countdown_tiny.export import check_warm_start, read_export_info, warm_start_dir
from ..countdown_tiny.task import EVAL_STEPS, QUICK_EVAL_STEPS

#: `(label, method, overrides)`: GRPO; the entropy bonus at two coefficients (0.01: the usual LLM value and
#: `frontier.PUBLISHED`; 0.1: the countdown sweep's best); each method at its published setting and at its best
#: setting from the countdown sweep (docs/what_it_shows.md; ProGRPO's best is its published alpha 0.3); one
#: composition (ProGRPO+CaSP at their published settings); the entropy-band controller; the pass@k-objective
#: methods at their default settings (k = 4 is ours, see below).
SETTINGS: list[tuple[str, str, dict[str, Any]]] = [
    # In run order (two at a time, every seed of a pair before the next pair; see `plan`), so a run stopped by the
    # clock has the most-asked comparisons: GRPO and the demo's method first, the published-only settings last.
    ("grpo", "grpo", {}),
    ("dsgrpo_best", "dsgrpo", {"ds_gamma_p": 0.1, "ds_gamma_n": 0.0, "ds_logp_granularity": "token"}),
    ("progrpo_published", "progrpo", dict(frontier.PUBLISHED["progrpo"])),
    ("entropy_0.1", "grpo_entropy", {"entropy_coef": 0.1}),
    ("entropy_0.01", "grpo_entropy", {"entropy_coef": 0.01}),
    ("kl_cov_best", "kl_cov", {"kl_cov_ratio": 0.02, "kl_cov_coef": 1.0}),
    ("casp_best", "casp", {**frontier.PUBLISHED["casp"], "casp_top1_penalty": 2.0}),
    ("clip_cov_best", "clip_cov", {"clip_cov_ratio": 2e-4, "clip_cov_lb": 1e8, "clip_cov_ub": 1e9}),
    ("progrpo+casp_published", "progrpo+casp", {**frontier.PUBLISHED["progrpo"], **frontier.PUBLISHED["casp"]}),
    # DS-GRPO's published setting in its literal trajectory form (the default granularity,
    # `sequence_sum`: docs/math.md, "DS-GRPO: differential smoothing");
    # `frontier.PUBLISHED` keeps the per-token form the earlier sweeps ran with.
    ("dsgrpo_published", "dsgrpo", {**frontier.PUBLISHED["dsgrpo"], "ds_logp_granularity": "sequence_sum"}),
    ("casp_published", "casp", dict(frontier.PUBLISHED["casp"])),
    ("kl_cov_published", "kl_cov", dict(frontier.PUBLISHED["kl_cov"])),
    ("clip_cov_published", "clip_cov", dict(frontier.PUBLISHED["clip_cov"])),
    # The two-sided entropy controller (issue 27) from the bonus that diverges: the band, fixed before the run, is
    # the warm start's 0.46 nats per token +- about a third.
    ("entropy_band_0.1", "grpo_entropy", {"entropy_coef": 0.1, "entropy_band": [0.3, 0.6]}),
    # The pass@k-objective methods of issue 27 (added after the first budget run was planned, so they run last): the
    # unlikeliness reward at its paper's beta; Pass@k Training and PKPO at k = 4, which is ours (`MethodInfo.chosen`:
    # their papers study several k). The labels name stored results (docs/curves.json, the demo), so they stay.
    ("unlikely_published", "unlikely", {"unlikely_beta": 0.25}),
    ("passk_published", "passk", {"passk_k": 4}),
    ("pkpo_published", "pkpo", {"pkpo_k": 4}),
]
QUICK_LABELS = ("grpo", "entropy_0.1", "dsgrpo_best")
BASELINE, ENTROPY_LABELS = "grpo", ("entropy_0.01", "entropy_0.1")
SEEDS = (0, 1, 2)
METRICS = ("pass@1", "pass@64", "distinct_correct", "token_entropy")
CURVES_FILE, PLOT_FILE = "curves.json", "curves.png"


def run_settings(quick: bool, seed: int, warm_start: Path | None = None) -> countdown_task.Settings:
    """The demo's settings (as `experiments.demo.demo_settings`: the warm start's split and model, the demo's RL batch,
    learning rate and evaluation) with RL seed `seed`. Rebuilt here rather than imported: `demo` imports
    this module."""
    info = read_export_info(Path(warm_start or warm_start_dir()))
    s = countdown_task.Settings(seed=int(info["seed"]), data=countdown_task.DataSettings(**info["settings"]["data"]),
                                model=countdown_task.ModelSettings(**info["settings"]["model"]))
    s.rl.seed = seed
    if quick:
        s.rl.prompts_per_step, s.rl.num_generations = 2, 4
        s.eval.n_samples, s.eval.num_problems = 8, 16
    return s


def settings_by_label() -> dict[str, tuple[str, dict[str, Any]]]:
    return {label: (method, overrides) for label, method, overrides in SETTINGS}


def _rows(history: list[dict], label: str, method: str, cfg: dict, seed: int, n: int) -> list[dict[str, Any]]:
    return [{"label": label, "method": method, "setting": dict(cfg), "seed": seed, **point}
            for point in countdown_rl.heldout_trajectory(history, n)]


def run_one(label: str, seed: int, steps: list[int], quick: bool, output: str,
            warm_start: str | None = None) -> dict[str, Any]:
    """Train one (setting, seed) from the warm start (default: the demo's), evaluating at `steps`; returns its
    record.

    The record is written after every evaluation (`<label>__seed<s>.json`, `"finished": false` until the budget is
    reached), so a run stopped early still counts with the checkpoints it evaluated."""
    from transformers import TrainerCallback

    method, overrides = settings_by_label()[label]
    checkpoint = Path(warm_start) if warm_start else warm_start_dir()
    s = run_settings(quick, seed, checkpoint)
    s.rl.steps = max(steps)
    train, test = countdown_task.make_problems(s.data, s.seed)
    bench = countdown_task.heldout_benchmark(test, s.eval.num_problems)
    out = Path(output) / "runs"
    n = s.eval.n_samples
    started, restore = time.perf_counter(), _common.quiet_training_logs()
    box: dict[str, Any] = {}

    def record(finished: bool) -> dict[str, Any]:
        trainer = box["trainer"]
        rec = {"label": label, "method": method, "setting": dict(box["cfg"]), "seed": seed, "steps": max(steps),
               "finished": finished, "last_step": trainer.state.global_step,
               "rows": _rows(trainer.state.log_history, label, method, box["cfg"], seed, n),
               "diverged": trainer.divergence, "seconds": time.perf_counter() - started,
               "eval_seconds": list(trainer.heldout_seconds), "n_samples": n, "num_problems": len(bench.records),
               **countdown_rl.reward_trend(trainer)}
        _common.write_json(out / f"{label}__seed{seed}.json", rec)
        return rec

    class WriteAfterEval(TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):
            record(finished=False)

    try:
        trainer, cfg = countdown_rl.build_rl_trainer(method, s, checkpoint, train,
                                                       out / "tmp" / f"{label}__seed{seed}", overrides,
                                                       callbacks=[WriteAfterEval()])
        box.update(trainer=trainer, cfg=cfg)
        countdown_rl.attach_heldout_eval(trainer, bench, s, steps, on_start=0 in steps)
        trainer.train()
    finally:
        restore()
    return record(finished=True)


def plan(labels: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """Run order: settings two at a time (one per worker), every seed of a pair before the next pair, so a run cut
    short by time has whole settings with several seeds rather than many settings with one."""
    out = []
    for i in range(0, len(labels), 2):
        out += [(lb, sd) for sd in seeds for lb in labels[i:i + 2]]
    return out


def collect(output: Path) -> list[dict[str, Any]]:
    """Every finished run record under `<output>/runs`."""
    return [json.loads(p.read_text()) for p in sorted((Path(output) / "runs").glob("*__seed*.json"))]


def verdicts(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`label -> {"vs_grpo": verdict, "vs_entropy_bonus": verdict}` (`curves_rule.verdict`)."""
    by_label: dict[str, list] = {}
    for r in rows:
        by_label.setdefault(r["label"], []).append(r)
    traj = {label: curves_rule.trajectory(rs) for label, rs in by_label.items()}
    grpo = [traj[BASELINE]] if BASELINE in traj else []
    bonus = [traj[lb] for lb in ENTROPY_LABELS if lb in traj]
    out = {}
    for label, t in traj.items():
        out[label] = {"vs_grpo": curves_rule.verdict(t, grpo) if label != BASELINE and grpo else None,
                      "vs_entropy_bonus": curves_rule.verdict(t, bonus)
                      if label not in ENTROPY_LABELS and bonus else None}
    return out


def closest_to_beating(data: dict[str, Any]) -> str | None:
    """The setting whose best checkpoint came closest to beating GRPO's trajectory (largest margin in standard
    errors, `curves_rule.verdict`'s `best`): the demo's default (`experiments/demo.py`). A setting that beats GRPO
    has the largest margin of all. None before any verdict."""
    scored = [(v["vs_grpo"]["best"]["z"], label) for label, v in data.get("verdicts", {}).items()
              if v.get("vs_grpo") and v["vs_grpo"].get("best")]
    return max(scored)[1] if scored else None


def _word(v: dict | None) -> str:
    if not v:
        return "-"
    b = v.get("best")
    if not b:
        return v["verdict"]
    return (f"{v['verdict']} (best: step {b['step']}, {100 * b['difference']:+.1f} pts = {b['z']:+.1f} SE; last: step "
            f"{v['last']['step']}, {100 * v['last']['difference']:+.1f} pts = {v['last']['z']:+.1f} SE)")


def _mean_or_none(values: list) -> float | None:
    """The mean of the values that are known (a model that never answers has no distinct-correct count)."""
    known = [v for v in values if v is not None]
    return curves_rule.mean_se(known)[0] if known else None


def markdown_table(data: dict[str, Any]) -> str:
    """Per setting: seeds, each evaluated step's mean pass@1 / pass@n (over the seeds that reached it), the last
    step's distinct correct and entropy, and the rule's verdicts."""
    rows = data["rows"]
    out = []
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        traj = curves_rule.trajectory(mine)
        last = max(r["step"] for r in mine)
        at_last = [r for r in mine if r["step"] == last]
        path = " → ".join(f"{100 * p1:.1f}/{100 * p64:.1f}" for _, p1, p64, _, _ in traj)
        dist, ent = (_mean_or_none([r[key] for r in at_last]) for key in ("distinct_correct", "token_entropy"))
        v = data["verdicts"].get(label, {})
        seeds = ",".join(str(s) for s in sorted({r["seed"] for r in mine}))
        out.append([label, seeds, last, path, "-" if dist is None else f"{dist:.2f}",
                    "-" if ent is None else f"{ent:.3f}", _word(v.get("vs_grpo")), _word(v.get("vs_entropy_bonus"))])
    header = ["setting", "seeds", "last step", "pass@1 / pass@n % at each evaluated step (seed means)",
              "distinct correct (last)", "entropy (last)", "vs GRPO's trajectory", "vs the entropy bonus"]
    return _common.markdown_table(header, out)


def summarize(output: Path, command: str, planned: list[tuple[str, int]], steps: list[int],
              seconds: float | None = None, warm_start: Path | None = None) -> dict[str, Any]:
    """`curves.json`'s content from the finished runs (also written to `<output>/curves.json`)."""
    records = collect(output)
    rows = [r for rec in records for r in rec["rows"]]
    done = {(rec["label"], rec["seed"]) for rec in records if rec.get("finished", True)}
    data = {
        "command": command,
        "eval_steps": steps,
        "rule": curves_rule.__doc__.strip(),
        "margin_se": curves_rule.MARGIN_SE,
        "settings": {label: {"method": m, "setting": o} for label, m, o in SETTINGS},
        "planned": [{"label": lb, "seed": sd} for lb, sd in planned],
        "ran": [{"label": rec["label"], "seed": rec["seed"], "steps": rec["steps"], "finished": rec.get("finished", True),
                 "last_step": rec.get("last_step"), "seconds": rec["seconds"],
                 "eval_seconds": rec["eval_seconds"], "diverged": rec["diverged"],
                 "reward_first": rec.get("reward_first"), "reward_last": rec.get("reward_last")} for rec in records],
        "missing": [{"label": lb, "seed": sd} for lb, sd in planned if (lb, sd) not in done],  # not finished
        "n_samples": records[0]["n_samples"] if records else None,
        "num_problems": records[0]["num_problems"] if records else None,
        "rows": rows,
        "verdicts": verdicts(rows) if rows else {},
        "wall_seconds": seconds,
        "warm_start": describe_warm_start(warm_start),
        "environment": _common.environment(),
    }
    _common.write_json(Path(output) / CURVES_FILE, data)
    return data


def describe_warm_start(warm_start: Path | None) -> dict[str, Any]:
    """Where the runs started: the folder, its export command and its size (the scale check changes it)."""
    path = Path(warm_start or warm_start_dir())
    info = read_export_info(path)
    shown = "exploration_trl/data/warm_start/countdown_tiny" if warm_start is None else str(path)  # no local paths
    return {"path": shown, "shipped": warm_start is None, "command": info.get("command"),
            "num_parameters": info.get("num_parameters"), "model": info["settings"]["model"],
            "pass_at_1": info.get("pass_at_1")}


def run_curves(labels: list[str], seeds: list[int], output: Path, quick: bool = False,
               steps: list[int] | None = None, workers: int = 2, command: str = "", log=None,
               warm_start: Path | None = None) -> dict[str, Any]:
    log = log or functools.partial(print, flush=True)
    steps = sorted(set(steps or (QUICK_EVAL_STEPS if quick else EVAL_STEPS)))
    output = Path(output)
    planned = plan(labels, seeds)
    done = {(rec["label"], rec["seed"]) for rec in collect(output) if rec.get("finished", True)}
    ws = str(warm_start) if warm_start else None
    jobs = [(lb, sd, steps, quick, str(output), ws) for lb, sd in planned if (lb, sd) not in done]
    log(f"[curves] {len(planned)} runs planned ({len(planned) - len(jobs)} already done in {output}), steps {steps}, "
        f"{workers} workers")

    def report(rec):
        last = rec["rows"][-1] if rec["rows"] else {}
        log(f"[curves] {rec['label']} seed {rec['seed']}: step {last.get('step')}, pass@1 "
            f"{100 * last.get('pass@1', float('nan')):.1f}, pass@64 {100 * last.get('pass@64', float('nan')):.1f} "
            f"({rec['seconds']:.0f} s)" + (f" DIVERGED: {rec['diverged']}" if rec["diverged"] else ""))

    with _common.Timer() as t:
        _common.run_jobs(run_one, jobs, workers=workers, threads=1, on_result=report)
    data = summarize(output, command, planned, steps, t.seconds, warm_start)
    from .curves_plot import plot_curves

    data["plot"] = str(plot_curves(data, output / PLOT_FILE))
    _common.write_json(output / CURVES_FILE, data)
    return data


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--curves-settings", default=None,
                   help=f"Comma-separated labels (default all: {', '.join(lb for lb, _, _ in SETTINGS)}).")
    p.add_argument("--curves-seeds", default=None, help="Comma-separated RL seeds (default 0,1,2).")
    p.add_argument("--curves-warm-start", default=None, metavar="DIR",
                   help="Start every run from this warm start (a folder of `countdown-tiny --sft-only --export DIR`) "
                        "instead of the demo's shipped one: the scale check.")
    p.add_argument("--curves-steps", default=None,
                   help=f"Comma-separated evaluation steps; the last is the budget (default {EVAL_STEPS}).")


def main(argv: list[str] | None = None) -> int:
    """`python -m exploration_trl.experiments.research.curves` (the same as `exploration-trl countdown-tiny --curves`)."""
    p = argparse.ArgumentParser(prog="python -m exploration_trl.experiments.research.curves", description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--output", default=None)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    return main_from_args(args, "python -m exploration_trl.experiments.research.curves " + " ".join(argv or []))


def main_from_args(args, command: str | None = None) -> int:
    for flag in ("methods", "sweep", "sft_only", "rl_steps", "grid", "rl_seeds"):
        if getattr(args, flag, None):
            raise ValueError(f"--{flag.replace('_', '-')} does not apply to --curves (its settings: --curves-settings; "
                             "its budget: the last of --curves-steps; its seeds: --curves-seeds)")
    _common.check_positive(args.workers, "--workers")
    labels = _common.parse_list(args.curves_settings, "--curves-settings", allowed=list(settings_by_label())) \
        if args.curves_settings else (list(QUICK_LABELS) if args.quick else [lb for lb, _, _ in SETTINGS])
    seeds = _common.parse_int_list(args.curves_seeds, "--curves-seeds") if args.curves_seeds else \
        ([0, 1] if args.quick else list(SEEDS))
    steps = _common.parse_int_list(args.curves_steps, "--curves-steps") if args.curves_steps else None
    output = Path(args.output or ("runs/countdown_tiny_curves_quick" if args.quick else "runs/countdown_tiny_curves"))
    if command is None:
        import shlex
        import sys

        command = "exploration-trl " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    warm_start = check_warm_start(args.curves_warm_start) if getattr(args, "curves_warm_start", None) else None
    data = run_curves(labels, seeds, output, quick=args.quick, steps=steps, workers=args.workers, command=command,
                      warm_start=warm_start)
    print(markdown_table(data))
    print(f"wrote {output / CURVES_FILE} and {data['plot']}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))

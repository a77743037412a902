"""`exploration-trl tree`: the multi-mode tree of CaSP (Sec. 4.3 / Fig. 5), trained with the real trainers.

The subcommand: its flags, the settings they give, and the dispatch between one comparison (`train.run_tree`) and
a sweep (`tree_sweep`). It sits above both (the `tree` package and the sweep import the package, never this module).
"""

from __future__ import annotations

from pathlib import Path

from .. import _common
from . import frontier
from .tree.task import DEFAULT_ACTIONS, DEFAULT_HORIZON, DEFAULT_REWARDING, TreeTask
from .tree.train import (
    DEFAULT_NUM_GENERATIONS,
    DEFAULT_STEPS,
    DEFAULT_SWEEP_SEEDS,
    OPTIMIZERS,
    POLICIES,
    QUICK_SWEEP_SEEDS,
    QUICK_SWEEP_STEPS,
    TrainSettings,
    run_tree,
)
from .tree_sweep import main_sweep

DEFAULT_METHODS = "grpo,grpo_entropy,progrpo,dsgrpo,casp,kl_cov"
DEFAULT_SEEDS = "0,1,2"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tree", help="CaSP's multi-mode tree (Sec. 4.3 / Fig. 5) with the real trainers, on the toy LM or a table.",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--actions", default=DEFAULT_ACTIONS, help="Action symbols, one character each (default %(default)s).")
    p.add_argument("--horizon", type=int, default=DEFAULT_HORIZON, help="Actions per sequence (default %(default)s).")
    p.add_argument("--rewarding", default=DEFAULT_REWARDING, help="Comma-separated rewarding sequences (default %(default)s).")
    p.add_argument("--policy", default="lm", choices=POLICIES,
                   help="lm: the toy Qwen2 (shared parameters); tabular: one categorical distribution per tree state, "
                        "CaSP's toy (default %(default)s).")
    p.add_argument("--optim", default=None, choices=list(OPTIMIZERS),
                   help="Optimizer (default: sgd for lm, adam for tabular).")
    p.add_argument("--methods", default=None,
                   help="Comma-separated methods: grpo, grpo_entropy (GRPO + TRL entropy_coef), progrpo, dsgrpo, casp, "
                        "kl_cov, clip_cov, or compositions like progrpo+casp (default: "
                        f"{DEFAULT_METHODS}; with --sweep every method of the grid).")
    p.add_argument("--seeds", default=None,
                   help=f"Comma-separated seeds (default {DEFAULT_SEEDS}; --sweep: {DEFAULT_SWEEP_SEEDS}; --sweep --quick: "
                        f"{QUICK_SWEEP_SEEDS}).")
    p.add_argument("--steps", type=int, default=None,
                   help=f"Optimizer steps per run (default {DEFAULT_STEPS}; --sweep --quick: {QUICK_SWEEP_STEPS}).")
    p.add_argument("--num-generations", type=int, default=DEFAULT_NUM_GENERATIONS,
                   help="Completions per step, one group (default %(default)s).")
    p.add_argument("--learning-rate", type=float, default=None,
                   help="Step size (default: 0.05 for lm, 0.1 for tabular).")
    p.add_argument("--trace-every", type=int, default=0,
                   help="Also record the exact accuracy/modes/entropy every N steps (0: off).")
    p.add_argument("--config", default=None,
                   help="YAML mapping method -> {config field: value} (and optional `all:`) overriding hyperparameters "
                        "(with --sweep: applied under each grid setting).")
    frontier.add_sweep_arguments(p, "accuracy against modes covered")
    p.add_argument("--quick", action="store_true", help="With --sweep: a one-seed, short, small-grid smoke sweep.")
    _common.add_output_dir(p, "Output folder (default runs/tree; with --sweep runs/tree_sweep).")
    p.add_argument("--no-plot", action="store_true", help="Skip the plots.")
    p.add_argument("--workers", type=int, default=2,
                   help="Runs trained in parallel processes (default %(default)s, one per core of a 2-core machine).")
    p.add_argument("--threads", type=int, default=1, help="Torch threads per process (default %(default)s).")
    p.set_defaults(func=main_from_args)


def settings_from_args(args) -> TrainSettings:
    steps = args.steps if args.steps is not None else (QUICK_SWEEP_STEPS if args.quick else DEFAULT_STEPS)
    _common.check_positive(steps, "--steps")
    _common.check_positive(args.num_generations, "--num-generations", 2)
    if args.trace_every < 0:
        raise ValueError(f"--trace-every must be >= 0, got {args.trace_every}")
    return TrainSettings(policy=args.policy, optim=args.optim, learning_rate=args.learning_rate, steps=steps,
                         num_generations=args.num_generations, trace_every=args.trace_every)


def main_from_args(args) -> int:
    task = TreeTask.from_flags(args.actions, args.horizon, args.rewarding)
    settings = settings_from_args(args)
    _common.check_positive(args.workers, "--workers")
    _common.check_positive(args.threads, "--threads")
    if args.sweep:
        return main_sweep(args, task, settings)
    if args.quick or args.grid:
        raise ValueError(f"{'--quick' if args.quick else '--grid'} applies to a sweep; add --sweep")
    methods = [_common.validate_method(m) for m in _common.parse_list(args.methods or DEFAULT_METHODS, "--methods")]
    seeds = _common.parse_int_list(args.seeds or DEFAULT_SEEDS, "--seeds")
    overrides = _common.load_overrides(args.config, methods)
    output = Path(args.output or "runs/tree")
    result = run_tree(task, methods, seeds, settings, output, overrides, plot=not args.no_plot,
                      workers=args.workers, threads=args.threads)
    print()
    print(f"Tree ({settings.policy} policy): actions {''.join(task.actions)}, horizon {task.horizon}, "
          f"{len(task.rewarding)} rewarding of {task.num_sequences} sequences; {settings.steps} steps x "
          f"{settings.num_generations} completions; mean ± std over seeds {','.join(map(str, seeds))}; masses in %")
    print(result["table"])
    print(f"\nwrote {output / 'tree.json'}" + (f" and {result['plot']}" if result.get("plot") else "")
          + f" in {result['seconds_total']:.0f}s")
    return 0

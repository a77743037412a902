"""`exploration-trl countdown-tiny`: a small real reasoning task on a CPU.

The subcommand: its flags, the settings they give, and the dispatch between one comparison (`rl.run_countdown`), a
sweep (`countdown_sweep`), the budget experiment (`curves`) and the warm-start export (`export.export_sft`). It sits
above all of them (the `countdown_tiny` package, the sweep and the curves import the package, never this module).
"""

from __future__ import annotations

from pathlib import Path

from .. import _common
from . import frontier
from .countdown_sweep import main_sweep
from ..countdown_tiny.export import export_command, export_sft
from ..countdown_tiny.rl import run_countdown
from ..countdown_tiny.sft import default_cache_dir
from ..countdown_tiny.task import SETTINGS_TABLE, Settings, quick_settings
from .curves import add_arguments as add_curves_arguments
from .curves import main_from_args as main_curves

DEFAULT_METHODS = "grpo,grpo_entropy,progrpo,dsgrpo,casp,kl_cov"


def _defaults(section: str, key: str) -> str:
    default, quick = SETTINGS_TABLE[section][key]
    return f"default {default:g}; quick {quick:g}"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "countdown-tiny", help="Countdown (3 numbers) on a CPU: SFT warm start, RL per method, pass@k comparison.",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--methods", default=None,
                   help="Comma-separated methods: grpo, grpo_entropy, progrpo, dsgrpo, casp, kl_cov, clip_cov, or "
                        f"compositions like progrpo+casp (default {DEFAULT_METHODS}; with --sweep every method of the "
                        "grid).")
    _common.add_output_dir(p, "Output folder (default runs/countdown_tiny; --sweep: runs/countdown_tiny_sweep; "
                              "--sft-only: runs/countdown_tiny_sft).")
    p.add_argument("--quick", action="store_true", help="A few-minute smoke run (small data, model, RL and eval).")
    p.add_argument("--seed", type=int, default=0,
                   help="Seed of the split, SFT, RL and sampling (default %(default)s).")
    p.add_argument("--rl-steps", type=int, default=None,
                   help=f"RL optimizer steps per method ({_defaults('rl', 'steps')}; --sweep: see --sweep).")
    p.add_argument("--n-samples", type=int, default=None,
                   help=f"Samples per test problem ({_defaults('eval', 'n_samples')}).")
    p.add_argument("--num-test", type=int, default=None,
                   help=f"Test problems evaluated ({_defaults('eval', 'num_problems')}).")
    p.add_argument("--rl-learning-rate", type=float, default=None,
                   help=f"RL step size (Adam; {_defaults('rl', 'learning_rate')}).")
    p.add_argument("--sft-steps", type=int, default=None, help=f"SFT optimizer steps ({_defaults('sft', 'steps')}).")
    p.add_argument("--sft-hidden-size", type=int, default=None,
                   help=f"Hidden size of the toy model ({_defaults('model', 'hidden_size')}; a multiple of 8); its MLP "
                        "width follows as 8/3 x hidden, rounded to a multiple of 16.")
    p.add_argument("--sft-layers", type=int, default=None,
                   help=f"Layers of the toy model ({_defaults('model', 'num_hidden_layers')}).")
    p.add_argument("--cache-dir", default=None,
                   help="Where SFT checkpoints are cached (default $XDG_CACHE_HOME/exploration_trl/countdown_tiny).")
    p.add_argument("--config", default=None,
                   help="YAML mapping method -> {config field: value} (and optional `all:`) overriding RL "
                        "hyperparameters (with --sweep: applied under each grid setting).")
    frontier.add_sweep_arguments(p, "pass@1 against pass@k, from the same warm start")
    p.add_argument("--rl-seeds", default=None,
                   help="With --sweep: comma-separated RL seeds per setting (default: --seed); the split and the warm "
                        "start keep --seed.")
    p.add_argument("--sft-only", action="store_true",
                   help="Train only the SFT warm start and export it with --export DIR (checkpoint + held-out pass@k).")
    p.add_argument("--export", default=None, help="With --sft-only: folder to write the checkpoint to (must not exist).")
    p.add_argument("--workers", type=int, default=2,
                   help="Methods trained in parallel processes (default %(default)s, one per core of a 2-core machine).")
    p.add_argument("--threads", type=int, default=1, help="Torch threads per process (default %(default)s).")
    p.add_argument("--curves", action="store_true",
                   help="The budget experiment (experiments/research/curves.py): every setting trained from the shipped warm "
                        "start and evaluated on the held-out problems as it trains, at steps 0..1500; verdicts by the "
                        "rule of experiments/curves_rule.py. Writes curves.json and curves.png.")
    add_curves_arguments(p)
    p.set_defaults(func=main_from_args)


def settings_from_args(args) -> Settings:
    if args.seed is None or args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    s = quick_settings(args.seed) if args.quick else Settings(seed=args.seed)
    if args.rl_steps is not None:
        _common.check_positive(args.rl_steps, "--rl-steps")
        s.rl.steps = args.rl_steps
    if args.n_samples is not None:
        _common.check_positive(args.n_samples, "--n-samples")
        s.eval.n_samples = args.n_samples
    if args.num_test is not None:
        _common.check_positive(args.num_test, "--num-test")
        if args.num_test > s.data.num_test:
            raise ValueError(f"--num-test must be <= {s.data.num_test} (the size of the held-out split), got {args.num_test}")
        s.eval.num_problems = args.num_test
    if args.rl_learning_rate is not None:
        if not args.rl_learning_rate > 0:
            raise ValueError(f"--rl-learning-rate must be > 0, got {args.rl_learning_rate}")
        s.rl.learning_rate = args.rl_learning_rate
    if args.sft_steps is not None:
        _common.check_positive(args.sft_steps, "--sft-steps")
        s.sft.steps = args.sft_steps
    if args.sft_hidden_size is not None:
        if args.sft_hidden_size < 8 or args.sft_hidden_size % 8:
            raise ValueError(f"--sft-hidden-size must be a positive multiple of 8, got {args.sft_hidden_size}")
        s.model.hidden_size = args.sft_hidden_size
        s.model.intermediate_size = 16 * round(8 * args.sft_hidden_size / 3 / 16)
    if args.sft_layers is not None:
        _common.check_positive(args.sft_layers, "--sft-layers")
        s.model.num_hidden_layers = args.sft_layers
    return s


def main_from_args(args) -> int:
    if getattr(args, "curves", False):
        return main_curves(args)
    settings = settings_from_args(args)
    _common.check_positive(args.workers, "--workers")
    _common.check_positive(args.threads, "--threads")
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    if args.export and not args.sft_only:
        raise ValueError("--export applies to --sft-only; add --sft-only")
    if args.sft_only:
        if not args.export:
            raise ValueError("--sft-only needs --export DIR, the folder to write the checkpoint to")
        if args.sweep or args.methods:
            raise ValueError("--sft-only trains no RL method; drop --sweep/--methods")
        info = export_sft(settings, cache, Path(args.export), Path(args.output or "runs/countdown_tiny_sft"),
                          export_command(args))
        print(f"\nwrote {args.export} ({info['size_mb']:.2f} MB, {info['num_parameters']:,} parameters): held-out "
              f"pass@1 {100 * info['pass_at_1']:.1f}% on {info['heldout']['num_problems']} problems x "
              f"{info['heldout']['n_samples']} samples")
        return 0
    if args.sweep:
        return main_sweep(args, settings, cache)
    if args.grid or args.rl_seeds:
        raise ValueError(f"{'--grid' if args.grid else '--rl-seeds'} applies to a sweep; add --sweep")
    methods = [_common.validate_method(m) for m in _common.parse_list(args.methods or DEFAULT_METHODS, "--methods")]
    overrides = _common.load_overrides(args.config, methods)
    output = Path(args.output or "runs/countdown_tiny")
    result = run_countdown(methods, settings, output, cache, overrides, workers=args.workers, threads=args.threads)
    print()
    print(f"countdown-tiny: {result['split']['num_test_evaluated']} held-out problems x {settings.eval.n_samples} "
          f"samples (temperature {settings.eval.temperature}); {settings.rl.steps} RL steps per method")
    print(result["table"])
    print(f"\nwrote {output / 'countdown_tiny.json'} and {result['plot']} in {result['seconds']['total']:.0f}s")
    return 0

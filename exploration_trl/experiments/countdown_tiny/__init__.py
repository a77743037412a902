"""`exploration-trl countdown-tiny`: a small real reasoning task on a CPU.

1. **Problems.** Countdown with 3 numbers: reach `target` with `+ - * /` and parentheses, each number used once.
   Every multiset of 3 numbers in `1..max_num` is expanded into all its expressions (exact `Fraction`
   arithmetic, as the `countdown` reward evaluates them); every positive integer value up to `max_target` is a
   problem. A seeded shuffle splits the problems into a held-out test set and a training set with no
   `(numbers, target)` problem in common.
2. **Warm start (SFT).** The char-level toy Qwen2 is fine-tuned with a plain torch loop on correct solutions
   written in several orders and forms (`3*7+12`, `12+7*3`, `(7*3)+12`, ...), so each training problem has
   several distinct correct answers. The checkpoint is cached under `--cache-dir`, keyed by a hash of every
   setting that changes it, so reruns (and other methods) reuse it.
3. **RL.** Each method trains from that checkpoint with the same budget (`--rl-steps` optimizer steps, the same
   batch, group size, learning rate and seed) through its trainer class.
4. **Evaluation.** `exploration_trl.eval.run_eval` samples `--n-samples` completions per test problem from the
   SFT model and from every RL model, and reports pass@k for k = 1..n, token entropy and solution multiplicity
   (distinct correct equations per problem). The results are compared in one table and one overlaid pass@k plot.

Prompts are plain text (`"nums: 3 7 12\\ntarget: 33\\n"`); a completion is the bare equation followed by EOS, which
the `countdown` reward reads from the completion's last line.

Modules, one job each: `task` (settings, problems, split, prompts), `sft` (the cached warm start), `rl` (RL, evaluation
and the whole run), `report` (table, plot), `export` (`--sft-only --export`, the shipped warm start). Every public name
is importable from this package. The demo and the confirmatory runs use it; above it, in `experiments.research`: the
sweep (`--sweep`), the budget curves (`--curves`) and the subcommand's flags and dispatch
(`countdown_tiny_command`).
"""

from __future__ import annotations

from .export import EXPORT_INFO, export_command, export_sft, read_export_info
from .report import _compact as _compact
from .report import _plot as _plot
from .report import format_table, log_eval
from .rl import (
    WarmStart,
    attach_heldout_eval,
    build_rl_trainer,
    eval_at_steps,
    evaluate,
    heldout_trajectory,
    prepare,
    reward_trend,
    rl_and_eval,
    run_countdown,
    train_rl,
)
from .sft import (
    CACHE_VERSION,
    cache_key,
    default_cache_dir,
    load_checkpoint,
    train_sft,
    warm_start,
)
from .task import (
    OPS,
    SECTIONS,
    SETTINGS_TABLE,
    DataSettings,
    EvalSettings,
    ModelSettings,
    RLSettings,
    Settings,
    SFTSettings,
    expressions,
    heldout_benchmark,
    make_problems,
    prompt_text,
    quick_settings,
    render,
    solutions,
)
from .task import _key as _key
from .task import _table as _table
from .task import _value as _value

__all__ = [
    "CACHE_VERSION",
    "EXPORT_INFO",
    "OPS",
    "SECTIONS",
    "SETTINGS_TABLE",
    "DataSettings",
    "EvalSettings",
    "ModelSettings",
    "RLSettings",
    "SFTSettings",
    "Settings",
    "WarmStart",
    "attach_heldout_eval",
    "build_rl_trainer",
    "cache_key",
    "default_cache_dir",
    "eval_at_steps",
    "evaluate",
    "export_command",
    "export_sft",
    "expressions",
    "format_table",
    "heldout_benchmark",
    "heldout_trajectory",
    "load_checkpoint",
    "log_eval",
    "make_problems",
    "prepare",
    "prompt_text",
    "quick_settings",
    "read_export_info",
    "render",
    "reward_trend",
    "rl_and_eval",
    "run_countdown",
    "solutions",
    "train_rl",
    "train_sft",
    "warm_start",
]

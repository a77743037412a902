"""`exploration-trl tree`: the multi-mode tree of CaSP (Sec. 4.3 / Fig. 5), trained with the real trainers.

A policy picks `horizon` actions from `actions`; a sequence earns reward 1 when it is one of the `rewarding`
sequences, else 0. Several rewarding sequences ("modes") exist, so the question is not whether a method finds
one but whether it keeps probability on all of them: plain GRPO sharpens onto a single mode, an entropy bonus
keeps spread but leaks mass to wrong sequences, and exploration-preserving methods should keep several modes
at high accuracy.

The policy is the package's toy causal LM (a tiny Qwen2) with a word-level tokenizer whose only non-special
tokens are the actions and one prompt token. Every method trains through its trainer class from
`exploration_trl.get_trainer_class` exactly as a user would train a real model; the tree only shows up in the
tokenizer, the output layer, the reward function and the generation settings:

* the output layer has a frozen -1e4 bias on every non-action token (`mask_output_head`), so the trainers'
  log-probs, entropies and top-N candidates are those of the action distribution that is sampled;
* `max_completion_length=horizon`, `generation_kwargs={"min_new_tokens": horizon, "suppress_tokens": [every
  non-action token]}`: generation samples `softmax(logits[actions] / temperature)` at each of exactly `horizon`
  steps (the reward function counts any completion that is not `horizon` action tokens; the count is reported);
* after training, every one of the `|actions| ** horizon` sequences is scored in one batched forward pass and
  its probability is computed exactly, renormalising over the action tokens at the training temperature (the
  distribution generation samples from); no sampling is involved in the reported numbers.

Two policies (`--policy`): `lm` (the default) is the toy Qwen2 above, trained with plain SGD; `tabular` is CaSP's
own setting, one categorical distribution per tree state (`research.tabular`), trained with Adam. `--sweep`
trains each method over a grid of strengths and draws its accuracy-diversity frontier (`research.tree_sweep`).
Results, runtimes and what each method did: docs/what_it_shows.md.

Modules, one job each: `task` (the task, the policy model, the exact distribution), `train` (run settings, one run,
every run), `report` (summary, table, plot). Every public name is importable from this package. Above it:
`research.tree_sweep` (`--sweep`) and the subcommand's flags and dispatch, `research.tree_command`.
"""

from __future__ import annotations

from .report import format_table, plot_tree, summarise
from .task import (
    DEFAULT_ACTIONS,
    DEFAULT_HORIZON,
    DEFAULT_MODEL,
    DEFAULT_REWARDING,
    MASK_LOGIT,
    MAX_SEQUENCES,
    MODE_THRESHOLD,
    PROMPT,
    PROMPT_TOKEN,
    TreeTask,
    action_token_ids,
    build_tree_policy,
    build_tree_tokenizer,
    distribution_metrics,
    exact_metrics,
    mask_output_head,
    sequence_log_probs,
    tree_generation_kwargs,
)
from .train import (
    DEFAULT_NUM_GENERATIONS,
    DEFAULT_STEPS,
    DEFAULT_SWEEP_SEEDS,
    OPTIMIZERS,
    POLICIES,
    POLICY_DEFAULTS,
    QUICK_SWEEP_SEEDS,
    QUICK_SWEEP_STEPS,
    TREE_METHOD_DEFAULTS,
    TrainSettings,
    build_policy,
    run_tree,
    train_one,
)

__all__ = [
    "DEFAULT_ACTIONS",
    "DEFAULT_HORIZON",
    "DEFAULT_MODEL",
    "DEFAULT_NUM_GENERATIONS",
    "DEFAULT_REWARDING",
    "DEFAULT_STEPS",
    "DEFAULT_SWEEP_SEEDS",
    "MASK_LOGIT",
    "MAX_SEQUENCES",
    "MODE_THRESHOLD",
    "OPTIMIZERS",
    "POLICIES",
    "POLICY_DEFAULTS",
    "PROMPT",
    "PROMPT_TOKEN",
    "QUICK_SWEEP_SEEDS",
    "QUICK_SWEEP_STEPS",
    "TREE_METHOD_DEFAULTS",
    "TrainSettings",
    "TreeTask",
    "action_token_ids",
    "build_policy",
    "build_tree_policy",
    "build_tree_tokenizer",
    "distribution_metrics",
    "exact_metrics",
    "format_table",
    "mask_output_head",
    "plot_tree",
    "run_tree",
    "sequence_log_probs",
    "summarise",
    "train_one",
    "tree_generation_kwargs",
]

"""Training on the tree: the run settings, one (method, seed) run through its trainer class, and every run of an
experiment (`run_tree`, which writes `tree.json` and `tree.png`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ... import _common
from .report import _init_stats, format_table, plot_tree, summarise
from .task import (
    DEFAULT_MODEL,
    PROMPT,
    TreeTask,
    action_token_ids,
    build_tree_policy,
    build_tree_tokenizer,
    exact_metrics,
    tree_generation_kwargs,
)

DEFAULT_STEPS = 200
DEFAULT_NUM_GENERATIONS = 16
#: `--sweep` seeds: 4 seeds keep the default tabular sweep (72 settings) under 15 minutes on 2 cores.
DEFAULT_SWEEP_SEEDS = "0,1,2,3"
#: `--sweep --quick` (CI smoke sweep): steps per run and seeds.
QUICK_SWEEP_STEPS = 40
QUICK_SWEEP_SEEDS = "0"
#: The two policies: the toy Qwen2 (`lm`, shared parameters) and CaSP's tabular policy (`research.tabular`).
POLICIES = ("lm", "tabular")
#: `--optim` names -> `TrainingArguments.optim` (Adam without weight decay: TRL's default `weight_decay` is 0).
OPTIMIZERS = {"adam": "adamw_torch", "sgd": "sgd"}
#: Optimizer and step size per policy. `lm`: plain SGD (no momentum), step 0.05. With Adam, the near-deterministic
#: network's all-correct groups (zero gradient) still moved the weights (momentum) and rare spiky gradients were
#: normalised to full-size steps; runs jumped from ~97% accuracy onto a wrong sequence in one step and never
#: recovered (0 reward -> 0 advantage), see docs/what_it_shows.md. `tabular`: Adam, as tabular softmax policies are
#: usually trained, step 0.1: the smallest of 0.05 / 0.1 with which GRPO passes 99.5% accuracy within 200 steps on
#: every seed (0.05 stays near 99.2%). The table's logits are independent, so no step leaks between states.
POLICY_DEFAULTS = {"lm": ("sgd", 0.05), "tabular": ("adam", 0.1)}
#: Per-method defaults for the tree, applied before `--config`: every method runs with its config class's defaults
#: (a source's values where one gives them, ours otherwise: `MethodInfo.published` / `chosen`); only the plain entropy bonus, which has no paper value here, gets a coefficient
#: large enough to matter on a 3-token problem.
TREE_METHOD_DEFAULTS: dict[str, dict[str, Any]] = {"grpo_entropy": {"entropy_coef": 0.2}}


@dataclass(frozen=True)
class TrainSettings:
    """How one tree run trains: the policy, its optimizer and step size (None: `POLICY_DEFAULTS`), the budget."""

    policy: str = "lm"
    optim: str | None = None
    learning_rate: float | None = None
    steps: int = DEFAULT_STEPS
    num_generations: int = DEFAULT_NUM_GENERATIONS
    trace_every: int = 0
    mask_head: bool = True
    model_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"--policy: unknown policy '{self.policy}'; choose one of {', '.join(POLICIES)}")
        if self.optim is not None and self.optim not in OPTIMIZERS:
            raise ValueError(f"--optim: unknown optimizer '{self.optim}'; choose one of {', '.join(OPTIMIZERS)}")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ValueError(f"--learning-rate must be > 0, got {self.learning_rate}")

    def resolved(self) -> TrainSettings:
        """A copy with the policy's default optimizer and step size filled in."""
        optim, lr = POLICY_DEFAULTS[self.policy]
        return replace(self, optim=self.optim or optim,
                       learning_rate=self.learning_rate if self.learning_rate is not None else lr)

    def describe(self) -> dict[str, Any]:
        out = asdict(self.resolved())
        if self.policy == "lm":
            out["model"] = {**DEFAULT_MODEL, **out.pop("model_kwargs")}
        else:
            out.pop("model_kwargs")
            out.pop("mask_head")
        return out


def build_policy(task: TreeTask, settings: TrainSettings, seed: int = 0):
    """`(model, tokenizer)` of `settings.policy`: the toy LM (`build_tree_policy`) or the tabular policy (uniform
    over actions at every state; the seed then only changes sampling)."""
    if settings.policy == "lm":
        return build_tree_policy(task, seed=seed, mask_head=settings.mask_head, **settings.model_kwargs)
    from ..tabular import build_tabular_model

    tok = build_tree_tokenizer(task)
    return build_tabular_model(tok, action_token_ids(tok, task), task.horizon, seed=seed), tok


class _RewardCounter:
    """The tree reward (1 for a rewarding sequence) that also counts completions that are not H actions."""

    def __init__(self, task: TreeTask, tokenizer):
        self.task = task
        self.id_to_action = dict(zip(action_token_ids(tokenizer, task), task.actions))
        self.rewarding = set(task.rewarding)
        self.total = 0
        self.invalid = 0
        self.__name__ = "tree_reward"

    def __call__(self, completions, completion_ids=None, **kwargs):
        out = []
        for ids in completion_ids:
            ids = list(ids)
            self.total += 1
            if len(ids) != self.task.horizon or any(i not in self.id_to_action for i in ids):
                self.invalid += 1
                out.append(0.0)
                continue
            out.append(1.0 if "".join(self.id_to_action[i] for i in ids) in self.rewarding else 0.0)
        return out


def _trace_callback(task, tokenizer, every: int, trace: list, temperature: float):
    from transformers import TrainerCallback

    class ExactTrace(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if every > 0 and model is not None and (state.global_step % every == 0 or state.global_step == state.max_steps):
                m = exact_metrics(model, tokenizer, task, temperature)
                trace.append({"step": state.global_step, "accuracy": m["accuracy"], "modes_covered": m["modes_covered"],
                              "entropy": m["entropy"], "mass": m["mass"]})

    return ExactTrace()


#: Logged training metrics kept in tree.json (means over the run's log entries).
_KEPT_METRICS = ("reward", "entropy", "casp/forking_frac", "casp/top1_penalty_frac", "kl_cov/selected_tokens",
                 "clip_cov/selected_tokens", "progrpo/adjustment_abs_mean", "dsgrpo/bonus_mean", "dsgrpo/penalty_mean",
                 "frac_reward_zero_std", "exploration/lambda_1", "exploration/branching_factor")


def _summarise_logs(history: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _KEPT_METRICS:
        vals = [h[key] for h in history if key in h and isinstance(h[key], (int, float)) and math.isfinite(h[key])]
        if vals:
            out[key] = {"mean": sum(vals) / len(vals), "last": vals[-1]}
    return out


def train_one(task: TreeTask, method: str, seed: int, settings: TrainSettings, output_dir: str | Path,
              overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train one method from the seed's initial policy and return its exact end-of-training metrics."""
    from datasets import Dataset

    settings = settings.resolved()
    restore = _common.quiet_training_logs()
    try:
        model, tok = build_policy(task, settings, seed)
        method_overrides = {**TREE_METHOD_DEFAULTS.get(method, {}), **(overrides or {})}
        trainer_cls, cfg_overrides = _common.resolve_method(method, method_overrides)
        num_generations = settings.num_generations
        kwargs = _common.common_config_kwargs(
            Path(output_dir) / f"{method}_seed{seed}", seed, settings.steps,
            per_device_train_batch_size=num_generations,
            num_generations=num_generations,
            max_completion_length=task.horizon,
            learning_rate=settings.learning_rate,
            generation_kwargs=tree_generation_kwargs(tok, task),
            optim=OPTIMIZERS[settings.optim],
        )
        kwargs.update(cfg_overrides)
        try:
            args = trainer_cls.config_class(**kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError(f"method '{method}': {str(e).splitlines()[0]}") from None
        temperature = float(args.temperature)
        init = exact_metrics(model, tok, task, temperature)
        reward = _RewardCounter(task, tok)
        trace: list[dict] = []
        spg = args.steps_per_generation or 1
        rows = max(64, settings.steps * spg * max(1, args.per_device_train_batch_size // num_generations) + 16)
        dataset = Dataset.from_dict({"prompt": [PROMPT] * rows})
        cpu0 = _common.cpu_seconds()
        with _common.Timer() as t:
            trainer = trainer_cls(model=model, processing_class=tok, reward_funcs=reward, args=args,
                                  train_dataset=dataset,
                                  callbacks=[_trace_callback(task, tok, settings.trace_every, trace, temperature)])
            _common.drop_printer(trainer)
            trainer.train()
        final = exact_metrics(trainer.model, tok, task, temperature)
        history = list(trainer.state.log_history)
        del trainer
        return {
            "method": method,
            "seed": seed,
            "steps": settings.steps,
            "seconds": t.seconds,
            "cpu_seconds": _common.cpu_seconds() - cpu0,
            "config": dict(cfg_overrides),
            "temperature": temperature,
            "invalid_completions": reward.invalid,
            "sampled_completions": reward.total,
            "init": init,
            "final": final,
            "train_metrics": _summarise_logs(history),
            "trace": trace,
        }
    finally:
        restore()


def run_tree(task: TreeTask, methods: Sequence[str], seeds: Sequence[int], settings: TrainSettings,
             output: str | Path, overrides: dict[str, dict[str, Any]] | None = None, plot: bool = True,
             workers: int = 1, threads: int | None = 1, log=print) -> dict[str, Any]:
    """Train every (method, seed), write `output/tree.json` (+ `tree.png`), return the JSON content."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    jobs = [(task, method, seed, settings, output / "runs", (overrides or {}).get(method))
            for method in methods for seed in seeds]

    def report(r):
        f = r["final"]
        log(f"[tree] {r['method']:>14s} seed {r['seed']}: accuracy {f['accuracy']:.3f}, modes {f['modes_covered']}, "
            f"entropy {f['entropy']:.2f} ({r['seconds']:.1f}s)")

    with _common.Timer() as total:
        runs = _common.run_jobs(train_one, jobs, workers=workers, threads=threads, on_result=report)
    summary = summarise(task, runs)
    result = {
        "experiment": "tree",
        "task": task.describe(),
        "settings": {"methods": list(methods), "seeds": list(seeds), **settings.describe(),
                     "per_device_train_batch_size": settings.num_generations,
                     "overrides": {m: (overrides or {}).get(m, {}) for m in methods},
                     "tree_method_defaults": {m: TREE_METHOD_DEFAULTS.get(m, {}) for m in methods}},
        "summary": summary,
        "runs": runs,
        "seconds_total": total.seconds,
        "workers": workers,
        "threads_per_worker": threads,
        "environment": _common.environment(),
    }
    init = _init_stats(runs)
    result["table"] = format_table(task, summary, init)
    _common.write_json(output / "tree.json", result)
    if plot:
        result["plot"] = str(plot_tree(task, runs, output / "tree.png"))
        _common.write_json(output / "tree.json", result)
    return result

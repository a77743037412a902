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
own setting, one categorical distribution per tree state (`experiments.tabular`), trained with Adam. `--sweep`
trains each method over a grid of strengths and draws its accuracy-diversity frontier (`experiments.tree_sweep`).
Results, runtimes and what each method did: docs/what_it_shows.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import _common, frontier

DEFAULT_ACTIONS = "ABCD"
DEFAULT_HORIZON = 3
DEFAULT_REWARDING = "ACD,ACB,BDC,BDA,CAB,DBA"
DEFAULT_METHODS = "grpo,grpo_entropy,progrpo,dsgrpo,casp,kl_cov"
DEFAULT_SEEDS = "0,1,2"
DEFAULT_STEPS = 200
DEFAULT_NUM_GENERATIONS = 16
#: `--sweep` seeds: 4 seeds keep the default tabular sweep (72 settings) under 15 minutes on 2 cores.
DEFAULT_SWEEP_SEEDS = "0,1,2,3"
#: `--sweep --quick` (CI smoke sweep): steps per run and seeds.
QUICK_SWEEP_STEPS = 40
QUICK_SWEEP_SEEDS = "0"
#: The two policies: the toy Qwen2 (`lm`, shared parameters) and CaSP's tabular policy (`experiments.tabular`).
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
#: Toy backbone for the tree (kwargs of `exploration_trl.toy.build_toy_model`).
DEFAULT_MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128)
#: A sequence counts as a covered mode when it holds at least this much probability.
MODE_THRESHOLD = 0.01
#: Guard on `|actions| ** horizon` for the exact enumeration.
MAX_SEQUENCES = 200_000

PROMPT_TOKEN = "<q>"
#: Two prompt tokens, so ProGRPO's prompt confidence (which skips the first prompt token) is defined.
PROMPT = f"{PROMPT_TOKEN} {PROMPT_TOKEN}"

#: Per-method defaults for the tree, applied before `--config`: every method runs with its published defaults
#: (its config class's defaults); only the plain entropy bonus, which has no paper value here, gets a coefficient
#: large enough to matter on a 3-token problem.
TREE_METHOD_DEFAULTS: dict[str, dict[str, Any]] = {"grpo_entropy": {"entropy_coef": 0.2}}


@dataclass(frozen=True)
class TreeTask:
    actions: tuple[str, ...]
    horizon: int
    rewarding: tuple[str, ...]

    @classmethod
    def from_flags(cls, actions: str, horizon: int, rewarding: str) -> TreeTask:
        acts = tuple(actions)
        if not acts:
            raise ValueError("--actions is empty; give the action symbols, e.g. ABCD")
        bad = [a for a in acts if a.isspace() or not a.isprintable()]
        if bad:
            raise ValueError(f"--actions must be printable non-space characters; got {actions!r}")
        if len(set(acts)) != len(acts):
            raise ValueError(f"--actions has repeated symbols: {actions!r}; each action must be one distinct character")
        if len(acts) < 2:
            raise ValueError("--actions needs at least 2 symbols")
        if horizon is None or horizon < 1:
            raise ValueError(f"--horizon must be >= 1, got {horizon}")
        if len(acts) ** horizon > MAX_SEQUENCES:
            raise ValueError(
                f"--actions/--horizon give {len(acts)}^{horizon} sequences, more than the {MAX_SEQUENCES} the exact "
                "enumeration allows; use fewer actions or a shorter horizon"
            )
        seqs = _common.parse_list(rewarding, "--rewarding")
        for s in seqs:
            if len(s) != horizon or any(ch not in acts for ch in s):
                raise ValueError(
                    f"--rewarding: '{s}' is not {horizon} symbols from --actions {''.join(acts)}; "
                    f"give comma-separated sequences like {''.join(acts[:horizon]) if len(acts) >= horizon else acts[0] * horizon}"
                )
        if len(seqs) == len(acts) ** horizon:
            raise ValueError("--rewarding lists every sequence; leave at least one non-rewarding sequence")
        return cls(acts, int(horizon), tuple(seqs))

    def describe(self) -> dict[str, Any]:
        return {"actions": "".join(self.actions), "horizon": self.horizon, "rewarding": list(self.rewarding),
                "num_sequences": self.num_sequences, "mode_threshold": MODE_THRESHOLD, "prompt": PROMPT}

    @property
    def num_sequences(self) -> int:
        return len(self.actions) ** self.horizon

    def sequences(self) -> list[str]:
        """Every action sequence, in `itertools.product` order (the order of `sequence_log_probs`)."""
        return ["".join(s) for s in itertools.product(self.actions, repeat=self.horizon)]


# ------------------------------------------------------------------------------------------ policy
def build_tree_tokenizer(task: TreeTask):
    from ..toy import build_toy_tokenizer

    return build_toy_tokenizer([PROMPT_TOKEN, *task.actions], level="word")


def build_tree_policy(task: TreeTask, seed: int = 0, mask_head: bool = True, **model_kwargs):
    """`(model, tokenizer)`: the toy Qwen2 over a vocabulary of special tokens, the prompt token and the actions.

    With `mask_head` (the default) the output layer gets a frozen bias of `MASK_LOGIT` on every non-action token,
    so the model's own next-token distribution *is* the action distribution: the log-probs, entropies and top-N
    candidates the trainers compute are those of the policy that generation samples from. Without it, only
    generation is restricted (`suppress_tokens`) while the trainers see the full vocabulary, and an entropy bonus
    (or any push-down) can park probability on never-sampled tokens (see docs/what_it_shows.md).
    """
    from ..toy import build_toy_model

    tok = build_tree_tokenizer(task)
    kwargs = {**DEFAULT_MODEL, **model_kwargs}
    model = build_toy_model(tok, seed=seed, **kwargs)
    if mask_head:
        mask_output_head(model, action_token_ids(tok, task))
    return model, tok


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
    from .tabular import build_tabular_model

    tok = build_tree_tokenizer(task)
    return build_tabular_model(tok, action_token_ids(tok, task), task.horizon, seed=seed), tok


#: Bias of non-action logits in the masked head: exp(-1e4) is exactly 0 in float32, and 0 * -1e4 stays finite.
MASK_LOGIT = -1e4


def mask_output_head(model, allowed_ids: Sequence[int], value: float = MASK_LOGIT) -> None:
    """Give `model.lm_head` a frozen bias: 0 on `allowed_ids`, `value` elsewhere (TRL's fused head and this
    package's `ops.lm_head` read `lm_head.bias`)."""
    import torch

    head = model.get_output_embeddings()
    new = torch.nn.Linear(head.in_features, head.out_features, bias=True, dtype=head.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        new.bias.fill_(value)
        new.bias[list(allowed_ids)] = 0.0
    new.bias.requires_grad_(False)
    model.set_output_embeddings(new)


def action_token_ids(tokenizer, task: TreeTask) -> list[int]:
    ids = [tokenizer.convert_tokens_to_ids(a) for a in task.actions]
    if tokenizer.unk_token_id in ids or len(set(ids)) != len(ids):
        raise ValueError(f"the tokenizer does not have one token per action {task.actions}")
    return ids


def tree_generation_kwargs(tokenizer, task: TreeTask) -> dict[str, Any]:
    """Extra `generate` kwargs (TRL's `generation_kwargs`) so a completion is exactly `horizon` action tokens."""
    actions = set(action_token_ids(tokenizer, task))
    suppress = [i for i in range(len(tokenizer)) if i not in actions]
    return {"min_new_tokens": task.horizon, "suppress_tokens": suppress}


def sequence_log_probs(model, tokenizer, task: TreeTask, temperature: float = 1.0, prompt: str = PROMPT,
                       batch_size: int = 4096):
    """Exact log-probability (float64, shape `(|A|^H,)`, `task.sequences()` order) of every action sequence under
    the distribution generation samples from: at each step `softmax(logits[action tokens] / temperature)`.

    One teacher-forced forward pass per chunk of sequences; the logits at prompt position `P-1+t` give step `t`.
    """
    import torch

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for an exact distribution, got {temperature}")
    action_ids = torch.tensor(action_token_ids(tokenizer, task))
    prompt_ids = torch.tensor(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    p, h = prompt_ids.numel(), task.horizon
    index = torch.tensor(list(itertools.product(range(len(task.actions)), repeat=h)), dtype=torch.long).view(-1, h)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        with torch.no_grad():
            for s in range(0, index.size(0), batch_size):
                idx = index[s : s + batch_size]
                ids = torch.cat([prompt_ids.expand(idx.size(0), p), action_ids[idx]], dim=1).to(device)
                logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
                step_logits = logits[:, p - 1 : p - 1 + h][:, :, action_ids.to(device)].double() / temperature
                logps = torch.log_softmax(step_logits, dim=-1)
                out.append(logps.gather(-1, idx.to(device).unsqueeze(-1)).squeeze(-1).sum(-1).cpu())
    finally:
        model.train(was_training)
    return torch.cat(out)


def distribution_metrics(task: TreeTask, probs: Sequence[float], threshold: float = MODE_THRESHOLD) -> dict[str, Any]:
    """Accuracy (mass on rewarding sequences), modes covered (rewarding sequences with >= `threshold` mass),
    entropy of the sequence distribution (nats), and the mass of every rewarding sequence."""
    seqs = task.sequences()
    probs = [float(x) for x in probs]
    if len(probs) != len(seqs):
        raise ValueError(f"{len(probs)} probabilities for {len(seqs)} sequences")
    by_seq = dict(zip(seqs, probs))
    mass = {s: by_seq[s] for s in task.rewarding}
    accuracy = sum(mass.values())
    entropy = -sum(q * math.log(q) for q in probs if q > 0)
    top = max(range(len(seqs)), key=lambda i: probs[i])
    wrong_top = max((s for s in seqs if s not in mass), key=lambda s: by_seq[s])
    return {
        "accuracy": accuracy,
        "modes_covered": sum(1 for v in mass.values() if v >= threshold),
        "entropy": entropy,
        "entropy_max": math.log(len(seqs)),
        "mass": mass,
        "non_rewarding_mass": 1.0 - accuracy,
        "top_sequence": seqs[top],
        "top_mass": probs[top],
        "top_non_rewarding": {"sequence": wrong_top, "mass": by_seq[wrong_top]},
        "total_mass": sum(probs),
    }


def exact_metrics(model, tokenizer, task: TreeTask, temperature: float = 1.0) -> dict[str, Any]:
    return distribution_metrics(task, sequence_log_probs(model, tokenizer, task, temperature).exp().tolist())


# ------------------------------------------------------------------------------------------ training
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


# ------------------------------------------------------------------------------------------ the experiment
def summarise(task: TreeTask, runs: list[dict]) -> dict[str, dict[str, Any]]:
    """Per method: mean and std over seeds of accuracy, modes covered, entropy and each rewarding sequence's mass."""
    out: dict[str, dict[str, Any]] = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        rs = [r["final"] for r in runs if r["method"] == method]
        entry: dict[str, Any] = {"num_seeds": len(rs)}
        for key in ("accuracy", "modes_covered", "entropy", "top_mass"):
            m, s = _common.mean_std([x[key] for x in rs])
            entry[key] = {"mean": m, "std": s, "per_seed": [x[key] for x in rs]}
        largest = [max(x["mass"].values()) for x in rs]
        m, s = _common.mean_std(largest)
        entry["largest_mode"] = {"mean": m, "std": s, "per_seed": largest}
        entry["mass"] = {}
        for seq in task.rewarding:
            m, s = _common.mean_std([x["mass"][seq] for x in rs])
            entry["mass"][seq] = {"mean": m, "std": s}
        entry["seconds"] = sum(r["seconds"] for r in runs if r["method"] == method)
        out[method] = entry
    return out


def format_table(task: TreeTask, summary: dict[str, dict[str, Any]], init: dict[str, Any] | None = None) -> str:
    """Markdown table: one row per method (mean ± std over seeds), masses in percent."""
    header = ["method", "accuracy", "modes (>=1%)", "entropy (nats)", "largest mode %", *task.rewarding]
    rows = []
    if init is not None:
        rows.append(["(initial policy)", _common.fmt_pm(init["accuracy"]), _common.fmt_pm(init["modes_covered"], 2),
                     _common.fmt_pm(init["entropy"], 2), _common.fmt_pm(init["largest"], 1, 100),
                     *[_common.fmt_pm(init["mass"][s], 1, 100) for s in task.rewarding]])
    for method, e in summary.items():
        per = lambda key: e[key]["per_seed"]  # noqa: E731
        rows.append([method, _common.fmt_pm(per("accuracy")), _common.fmt_pm(per("modes_covered"), 2),
                     _common.fmt_pm(per("entropy"), 2), _common.fmt_pm(per("largest_mode"), 1, 100),
                     *[_fmt_mass(e["mass"][s], e["num_seeds"]) for s in task.rewarding]])
    return _common.markdown_table(header, rows)


def _fmt_mass(m: dict, n: int) -> str:
    return f"{100 * m['mean']:.1f} ± {100 * m['std']:.1f}" if n > 1 else f"{100 * m['mean']:.1f}"


def _init_stats(runs: list[dict]) -> dict[str, Any]:
    inits = [r["init"] for r in runs]
    seen, uniq = set(), []
    for r in runs:  # one initial policy per seed (every method of a seed starts from it)
        if r["seed"] not in seen:
            seen.add(r["seed"])
            uniq.append(r["init"])
    inits = uniq or inits
    return {
        "accuracy": [x["accuracy"] for x in inits],
        "modes_covered": [x["modes_covered"] for x in inits],
        "entropy": [x["entropy"] for x in inits],
        "mass": {s: [x["mass"][s] for x in inits] for s in inits[0]["mass"]},
        "largest": [max(x["mass"].values()) for x in inits],
    }


def plot_tree(task: TreeTask, runs: list[dict], out_png: str | Path, title: str | None = None) -> Path:
    """One panel per (method, seed): final mass of every rewarding sequence plus the non-rewarding total, as CaSP
    Fig. 5(b-d). Rows are methods, columns seeds (averaging masses over seeds would hide which mode each run kept)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in runs))
    seeds = list(dict.fromkeys(r["seed"] for r in runs))
    labels = list(task.rewarding) + ["other"]
    colors = ["tab:green"] * len(task.rewarding) + ["tab:red"]
    nrows, ncols = len(methods), len(seeds)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.9 * ncols + 0.6, 1.75 * nrows + 0.8), squeeze=False,
                             sharey=True, sharex=True)
    try:
        for i, method in enumerate(methods):
            for j, seed in enumerate(seeds):
                ax = axes[i][j]
                run = next((r for r in runs if r["method"] == method and r["seed"] == seed), None)
                if run is None:
                    ax.axis("off")
                    continue
                f = run["final"]
                vals = [f["mass"][s] for s in task.rewarding] + [f["non_rewarding_mass"]]
                ax.bar(range(len(labels)), vals, color=colors, alpha=0.8)
                ax.set_ylim(0, 1)
                ax.axhline(MODE_THRESHOLD, color="grey", linewidth=0.6, linestyle=":")
                ax.grid(True, axis="y", alpha=0.3)
                ax.set_title(f"{method} s{seed}: acc {f['accuracy']:.2f}, modes {f['modes_covered']}", fontsize=8)
                ax.tick_params(labelsize=7)
            axes[i][0].set_ylabel("mass", fontsize=8)
        for ax in axes[-1]:
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=45, fontsize=7)
        fig.suptitle(title or f"Tree (|A|={len(task.actions)}, H={task.horizon}): exact final mass of each rewarding "
                     "sequence (green) and of all others (red)", fontsize=9)
        fig.tight_layout()
        return _common.save_figure(fig, out_png, dpi=110)
    finally:
        plt.close(fig)


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


# ------------------------------------------------------------------------------------------ CLI
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
    p.add_argument("--output", default=None,
                   help="Output folder (default runs/tree; with --sweep runs/tree_sweep).")
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
        from .tree_sweep import main_sweep

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

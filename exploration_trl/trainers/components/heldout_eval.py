"""Held-out pass@k while training: `evaluate()` samples `eval_n` completions per held-out problem with the current
policy and returns (and logs) the unbiased pass@k with a 95% confidence interval, the distinct correct answers per
problem and the token entropy.

It plugs into Hugging Face's own evaluation schedule, so `eval_strategy: steps`, `eval_steps`, `eval_on_start`,
`report_to`, `metric_for_best_model: eval_pass@64` and `load_best_model_at_end` work unchanged. Configured by
`eval_benchmark` (a built-in benchmark, `exploration_trl.eval.benchmarks`, or a local question/answer file) and
`eval_n`, `eval_ks`, `eval_num_problems`, `eval_temperature`, `eval_top_p`, `eval_max_tokens` (see
`ExplorationGRPOConfig`). From Python, an `exploration_trl.eval.Benchmark` (e.g. an in-memory held-out split) can
be passed instead: `Trainer(..., heldout_benchmark=bench)`.

What it relies on in transformers 5 / TRL 1.16 (pinned in `tests/test_trl_contract.py`):

* `Trainer._evaluate` calls `self.evaluate(ignore_keys=...)` and then reads `metric_for_best_model` (prefixed with
  `eval_`) from the returned dict to pick the best checkpoint; TRL's `GRPOTrainer` does not override `evaluate`
  (it overrides only `prediction_step`, which computes the GRPO loss on `eval_dataset`, and `log`).
* `Trainer.__init__` refuses `eval_strategy != "no"` without an `eval_dataset`; with a held-out benchmark and no
  `eval_dataset` the strategy is set to "no" for the duration of `__init__` only and restored after it (the
  schedule itself is read from `args` at every step by `DefaultFlowCallback`).
* TRL's `log` prefixes its own averaged metrics with `eval_` when the model is in eval mode, so the model is put
  in eval mode while the held-out metrics are logged.

With an `eval_dataset` as well, TRL's evaluation (the GRPO loss on it) runs first, then the held-out sampling; the
returned dict holds both and callbacks' `on_evaluate` is called by each.

Multi-process: problem `i` is sampled by process `i % world_size`; the graded rows are gathered to every process
(`gather_object`), so every process computes the same metrics (checkpoint selection needs them everywhere).
Sampling uses the transformers backend of the eval harness (`exploration_trl.eval.generation`) on the policy as
TRL unwraps it for generation (DeepSpeed ZeRO-3 parameters gathered); each problem's seed depends on the run seed
and the problem only, so every evaluation of a run samples with the same random numbers (common random numbers:
differences between checkpoints are the policy's, not the sampler's).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

__all__ = ["HeldoutEval", "check_heldout_config", "heldout_metrics", "passk_confidence_interval"]

logger = logging.getLogger(__name__)

#: Two-sided 95% normal quantile of the confidence intervals.
Z95 = 1.959963984540054


def check_heldout_config(args) -> None:
    """One-line errors for bad held-out evaluation keys (called by `ExplorationGRPOConfig.__post_init__`)."""
    if args.eval_benchmark is None:
        return
    if int(args.eval_n) < 1:
        raise ValueError(f"eval_n is {args.eval_n} but must be >= 1: completions sampled per held-out problem")
    ks = parse_eval_ks(args.eval_ks, int(args.eval_n))
    args.eval_ks = ks
    if args.eval_num_problems is not None and int(args.eval_num_problems) < 1:
        raise ValueError(f"eval_num_problems is {args.eval_num_problems} but must be >= 1 (or null: all problems)")
    if args.eval_temperature is not None and not args.eval_temperature > 0:
        raise ValueError(f"eval_temperature is {args.eval_temperature} but must be > 0: pass@k needs sampling "
                         "(null: the training temperature)")
    if not 0 < args.eval_top_p <= 1:
        raise ValueError(f"eval_top_p is {args.eval_top_p} but must be in (0, 1]")
    if args.eval_max_tokens is not None and int(args.eval_max_tokens) < 1:
        raise ValueError(f"eval_max_tokens is {args.eval_max_tokens} but must be >= 1 (null: max_completion_length)")


def parse_eval_ks(ks: Any, n: int) -> list[int]:
    """`eval_ks` as a sorted list (a list, or a comma-separated string); default: 1, 2, 4, ..., n."""
    from ...metrics import parse_ks

    return parse_ks(
        ks, n,
        not_integers="eval_ks is {ks!r} but must be integers, e.g. [1, 8, 64]",
        empty="eval_ks holds nothing but each k must satisfy 1 <= k <= eval_n={n}",
        too_small="eval_ks holds {k} but each k must satisfy 1 <= k <= eval_n={n}",
        too_large="eval_ks holds {k} but each k must satisfy 1 <= k <= eval_n={n}",
    )


def passk_confidence_interval(ns: list[int], cs: list[int], k: int) -> tuple[float, float, float]:
    """`(mean, low, high)`: the unbiased pass@k averaged over problems and its 95% normal interval, from the
    spread of the per-problem estimates (standard error = std over problems / sqrt(problems)), clipped to [0, 1].
    One problem gives a zero-width interval."""
    from ...metrics import pass_at_k

    per_problem = [float(pass_at_k(n, c, k)) for n, c in zip(ns, cs)]
    m = sum(per_problem) / len(per_problem)
    if len(per_problem) < 2:
        return m, m, m
    var = sum((p - m) ** 2 for p in per_problem) / (len(per_problem) - 1)
    half = Z95 * math.sqrt(var / len(per_problem))
    return m, max(0.0, m - half), min(1.0, m + half)


def heldout_metrics(rows: list[dict], ks: list[int], answer_type: str, prefix: str = "eval") -> dict[str, float]:
    """Flat metrics of graded rows (the eval harness's `samples.jsonl` rows): `{prefix}_pass@k` with `_ci_low` /
    `_ci_high`, `{prefix}_distinct_correct` (mean distinct correct answers per problem; absent for code; countdown also
    `{prefix}_distinct_correct_canonical`, up to commutativity/associativity),
    `{prefix}_token_entropy` (token-weighted, nats), `{prefix}_num_problems`."""
    from ...eval.summary import summarize

    summary = summarize(rows, ks=ks, answer_type=answer_type, diversity=False, semantic=False)
    ns = [len(r["correct"]) for r in rows]
    cs = [int(sum(bool(x) for x in r["correct"])) for r in rows]
    out: dict[str, float] = {}
    for k in ks:
        m, lo, hi = passk_confidence_interval(ns, cs, k)
        out[f"{prefix}_pass@{k}"] = m
        out[f"{prefix}_pass@{k}_ci_low"] = lo
        out[f"{prefix}_pass@{k}_ci_high"] = hi
    mult = summary.get("solution_multiplicity") or {}
    if mult.get("mean") is not None:
        out[f"{prefix}_distinct_correct"] = float(mult["mean"])
    if answer_type == "countdown":  # also counted up to commutativity/associativity of + and *
        from ...rewards.countdown import distinct_canonical

        counts = [distinct_canonical(r.get("answers") or [], r["correct"]) for r in rows]
        out[f"{prefix}_distinct_correct_canonical"] = sum(counts) / len(counts)
    if summary.get("token_entropy") is not None:
        out[f"{prefix}_token_entropy"] = float(summary["token_entropy"])
    out[f"{prefix}_num_problems"] = float(len(rows))
    return out


class HeldoutEval:
    """One trainer's held-out evaluation (module docstring): its benchmark, and what each evaluation took and found."""

    #: What it reads of its trainer (`trainers/view.py`): the only names its view gives.
    READS = ("accelerator", "args", "processing_class", "state", "unwrapped_for_generation")

    def __init__(self, view, benchmark=None):
        self.view = view
        self.seconds: list[float] = []
        self.correct_counts: list[int] | None = None  # correct samples per problem at the last evaluation
        self.benchmark = benchmark
        args = view.args
        if benchmark is None and getattr(args, "eval_benchmark", None) is not None:
            from ...eval import EvalError
            from ...eval.benchmarks import load_benchmark

            try:
                self.benchmark = load_benchmark(args.eval_benchmark, limit=args.eval_num_problems)
            except EvalError as e:  # unknown name, missing file or column
                raise ValueError(f"eval_benchmark {args.eval_benchmark!r}: {str(e).splitlines()[0]}") from None

    def evaluate(self, prefix: str = "eval") -> dict[str, float]:
        """Sample, grade and summarise the held-out benchmark with the current policy (every process must call it)."""
        from accelerate.utils import gather_object

        from ...eval.generation import TransformersGenerator, derive_seed
        from ...eval.harness import grade_problem
        from ...rewards import get_reward

        t = self.view
        bench, args = self.benchmark, t.args
        n = int(getattr(args, "eval_n", 64) or 64)
        ks = parse_eval_ks(getattr(args, "eval_ks", None), n)
        temperature = getattr(args, "eval_temperature", None) or args.temperature
        top_p = float(getattr(args, "eval_top_p", 1.0))
        max_tokens = int(getattr(args, "eval_max_tokens", None) or args.max_completion_length)
        batch = int(getattr(args, "eval_generation_batch_size", 256))
        rank, world = t.accelerator.process_index, t.accelerator.num_processes
        mine = list(range(rank, len(bench.records), world))
        reward_fn = get_reward(bench.reward, **bench.reward_kwargs)
        seed = int(args.seed if getattr(args, "eval_seed", None) is None else args.eval_seed)
        sampling = {"benchmark": bench.name, "n": n, "temperature": temperature, "top_p": top_p,
                    "max_tokens": max_tokens, "seed": seed, "step": t.state.global_step}
        started = time.perf_counter()
        rows = []
        with t.unwrapped_for_generation() as model, torch.no_grad():
            generator = TransformersGenerator((model, t.processing_class))
            per_call = max(1, batch // n)
            for start in range(0, len(mine), per_call):
                idx = mine[start:start + per_call]
                recs = [bench.records[i] for i in idx]
                samples = generator.generate([r["prompt"] for r in recs], n, temperature=temperature, top_p=top_p,
                                             max_new_tokens=max_tokens, batch_size=batch,
                                             seeds=[derive_seed(seed, i, str(r["id"])) for i, r in zip(idx, recs)],
                                             progress=False)
                for i, rec, s in zip(idx, recs, samples):
                    row = grade_problem(i, rec, s, bench, reward_fn, sampling, 0.0)
                    rows.append({k: row[k] for k in ("index", "correct", "answers", "entropies", "num_tokens",
                                                     "finish_reasons")})
        if world > 1:
            rows = [r for part in gather_object([rows]) for r in part]
        rows.sort(key=lambda r: r["index"])
        seconds = time.perf_counter() - started
        self.seconds.append(seconds)
        # Correct samples per problem, in benchmark order: what a per-problem analysis needs (e.g. a bootstrap over
        # problems), kept until the next evaluation.
        self.correct_counts = [int(sum(bool(x) for x in r["correct"])) for r in rows]
        out = heldout_metrics(rows, ks, bench.answer_type, prefix)
        out[f"{prefix}_heldout_seconds"] = seconds
        return out

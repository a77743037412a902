"""`ExplorationGRPOConfig`: TRL's `GRPOConfig` plus the keys every exploration method shares, and the checks on them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from ..core.advantages import check_position_bonus_shape
from ..core.dynamic_sampling import DYNAMIC_SAMPLING_METRICS
from ..methods import MethodInfo, arxiv_paper, register_shaping
from ..rewards.base import DEFAULT_CORRECT_THRESHOLD


#: The STILL report's advantage shapers, which any method switches on with `ppl_shaping_alpha` or
#: `position_bonus_gamma` (the config keys below); cards cite the report when one of them is not 0.
STILL = register_shaping(MethodInfo(
    name="still", side="shaping", display="STILL advantage shaping",
    summary="STILL report: perplexity shaping and a position bonus (any method)",
    description="Perplexity-based shaping of each completion's advantage and a position bonus that grows along the "
                "response.",
    paper=arxiv_paper(
        "deng2025still",
        "From Trial-and-Error to Improvement: A Systematic Analysis of LLM Exploration Mechanisms in RLVR",
        "Deng et al., 2025 (STILL report)",
        ["Jia Deng", "Jie Chen", "Zhipeng Chen", "Daixuan Cheng", "Fei Bai", "Beichen Zhang", "Yinqian Min",
         "Yanzipeng Gao", "Wayne Xin Zhao", "Ji-Rong Wen"], 2025, "2508.07534"),
    config_prefixes=("ppl_shaping_", "position_bonus_"),
    coefficients={"ppl_shaping_alpha": 0, "position_bonus_gamma": 0},
    published={"ppl_shaping_alpha": 0.01, "position_bonus_gamma": 0.1},
    where="Eq. 7/8/11/12",
    changes=("perplexity-shaped advantages; a position bonus `γ·σ(d·m·(l − n))` rising along the response, switched "
             "on at step 200 for 100 steps as in the report"),
    knobs_note="(shapers off by default; the report's values: `ppl_shaping_alpha=0.01`, `position_bonus_gamma=0.1`)",
))

#: `exploration_metrics_lambda` values: a token-weighted sample, or CaSP Eq. 2's per-response mean.
EXPLORATION_LAMBDA_MODES = ("sampled_tokens", "per_response")


@dataclass
class ExplorationGRPOConfig(GRPOConfig):
    """`GRPOConfig` plus the STILL advantage shapers and exploration-metric switches.

    With the defaults below (shapers off) training is exactly TRL's GRPO. Paper values: STILL report
    (Sec. 3, Eq. 11/12) uses `ppl_shaping_alpha=0.01` and `position_bonus_gamma=0.1`, the position bonus switched
    on at step 200 for 100 steps (the defaults of `position_bonus_start_step` / `position_bonus_num_steps`) with
    m = 15, d = 1 and the midpoint n re-centred to 0.5 (`position_bonus_center`; see `position_bonus_advantages`).
    """

    ppl_shaping_alpha: float = field(
        default=0.0,
        metadata={"help": "STILL perplexity shaping: A * (1 - alpha * w_ppl) (Eq. 11). 0 disables; paper: 0.01."},
    )
    position_bonus_gamma: float = field(
        default=0.0,
        metadata={"help": "STILL position bonus: A_t + sign(A) * gamma * sigmoid(...) (Eq. 12). 0 disables; paper: 0.1."},
    )
    position_bonus_scale: float = field(
        default=15.0,
        metadata={"help": "STILL position bonus steepness m in gamma * sigmoid(d * m * (l - n)) (Eq. 8; report: 15)."},
    )
    position_bonus_center: float = field(
        default=0.5,
        metadata={"help": "STILL position bonus midpoint n, a relative position in [0, 1] (Eq. 8). Default 0.5, "
                  "re-centred: the report prints n = -0.5, which read literally gives a flat ~gamma bonus for d = 1 "
                  "and ~0 for d = -1, against its own text; -0.5 gives that literal form."},
    )
    position_bonus_direction: float = field(
        default=1.0,
        metadata={"help": "STILL position bonus direction d (Eq. 8): 1 rewards late tokens more, -1 early ones."},
    )
    position_bonus_start_step: int = field(
        default=200,
        metadata={"help": "First global step at which the position bonus is applied (STILL report: step 200, once "
                  "the policy has learnt the task format)."},
    )
    position_bonus_num_steps: int | None = field(
        default=100,
        metadata={"help": "Number of steps the position bonus stays on (STILL report: 100; None: until the end)."},
    )
    correct_reward_threshold: float = field(
        default=DEFAULT_CORRECT_THRESHOLD,
        metadata={"help": "A completion is correct when its total (weighted) reward is above this (metrics, DS-GRPO, "
                  "ProGRPO's group-skip rule and keep_sign; `exploration_trl.rewards.is_correct`). Raise it above any partial "
                  "credit, e.g. 0.5 with a 0.1 format bonus."},
    )
    rollout_logps_from_generation: bool = field(
        default=True,
        metadata={"help": "When TRL computes no old log-probs (fully on-policy, transformers generation), read the "
                  "rollout log-probs ProGRPO, DS-GRPO and STILL shaping need from the logits generation already "
                  "computed, instead of one more forward pass over every completion. false: recompute them."},
    )
    exploration_metrics: bool = field(
        default=True, metadata={"help": "Log exploration metrics (entropy by correctness, Λ(n), branching, pass@G)."}
    )
    exploration_metrics_max_tokens: int = field(
        default=64,
        metadata={"help": "Completion tokens per micro-batch sampled for Λ(n) and the branching factor."},
    )
    exploration_metrics_lambda: str = field(
        default="sampled_tokens",
        metadata={"help": "How Λ(n), Λ(sample) and the branching factor average: 'sampled_tokens' (default: over up to "
                  "exploration_metrics_max_tokens random completion tokens, a token-weighted estimate) or "
                  "'per_response' (CaSP Eq. 2: every token of each response, averaged per response, then over the "
                  "responses; costs the LM head over every completion token on logging steps)."},
    )
    exploration_metrics_top_p: float = field(
        default=0.95, metadata={"help": "Top-p mass for the rollout branching factor (STILL Sec. 2.2)."}
    )
    eval_benchmark: str | None = field(
        default=None,
        metadata={"help": "Held-out pass@k while training (`trainers/components/heldout_eval.py`): a built-in benchmark name "
                  "(`exploration-trl eval --list`) or a local .jsonl/.json/.parquet file with question/answer columns. "
                  "Evaluated on HF's schedule (eval_strategy: steps, eval_steps, eval_on_start); logs eval_pass@k "
                  "with a 95% interval, eval_distinct_correct and eval_token_entropy. null: off."},
    )
    eval_n: int = field(default=64, metadata={"help": "Completions sampled per held-out problem."})
    eval_ks: list[int] | None = field(
        default=None, metadata={"help": "k values of the held-out pass@k (each <= eval_n; default 1, 2, 4, ..., eval_n)."})
    eval_num_problems: int | None = field(
        default=None, metadata={"help": "Evaluate the first N held-out problems only (null: all)."})
    eval_temperature: float | None = field(
        default=None, metadata={"help": "Held-out sampling temperature (null: the training temperature)."})
    eval_top_p: float = field(default=1.0, metadata={"help": "Held-out sampling top-p."})
    eval_max_tokens: int | None = field(
        default=None, metadata={"help": "Held-out completion budget in tokens (null: max_completion_length)."})
    eval_generation_batch_size: int = field(
        default=256, metadata={"help": "Sequences per `generate` call of the held-out evaluation."})
    eval_seed: int | None = field(
        default=None, metadata={"help": "Seed of the held-out sampling, independent of the run's `seed` (each problem's "
                  "sampler is seeded from it and the problem, the same at every evaluation; null: `seed`)."})
    divergence_window: int = field(
        default=20,
        metadata={"help": "Logged steps the divergence check (`trainers/callbacks/divergence.py`) averages over; 0 switches "
                  "the check off."},
    )
    divergence_entropy_factor: float = field(
        default=3.0,
        metadata={"help": "Entropy divergence: the last window's mean token entropy above this many times the first "
                  "window's, and above the window before it."},
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "DAPO's dynamic sampling (Sec. 3.2, Eq. 11): drop groups whose rewards do not vary, "
                  "generate more prompts until the batch is full (README)."},
    )
    dynamic_sampling_metric: str = field(
        default="correct",
        metadata={"help": "What must vary: 'correct' (DAPO; correct_reward_threshold) or 'reward'."},
    )
    dynamic_sampling_max_rounds: int = field(
        default=10, metadata={"help": "Most extra generation rounds per batch (verl's DAPO recipe: 10)."}
    )
    dynamic_sampling_on_exhausted: str = field(
        default="fill", metadata={"help": "Rounds ran out: 'fill' with dropped groups (warned) or 'error'."}
    )
    debug_rollout_dir: str | None = field(
        default=None,
        metadata={"help": "Debugging: save each generation batch's rewards and advantages per process as .pt files."},
    )
    entropy_band: list[float] | None = field(
        default=None,
        metadata={"help": "Two-sided entropy controller: [low, high] nats per token. After each optimizer step the "
                  "knob entropy_band_knob moves toward the band (trainers/callbacks/entropy_band.py); None switches it off."},
    )
    entropy_band_knob: str = field(
        default="entropy_coef",
        metadata={"help": "What the controller moves: entropy_coef (TRL's entropy bonus) or a coefficient a registered "
                  "method declares (trainers/callbacks/entropy_band.py's KNOBS, read from the registry: e.g. kl_cov_coef, "
                  "casp_alpha, entropy_adv_alpha); a key of the method's config."},
    )
    entropy_band_rate: float = field(
        default=0.1, metadata={"help": "Relative step of the knob per optimizer step: times or over (1 + rate)."})
    entropy_band_min: float = field(default=1e-4, metadata={"help": "Smallest value of the knob (> 0: the step is "
                                                                    "multiplicative)."})
    entropy_band_max: float = field(default=1.0, metadata={"help": "Largest value of the knob."})
    entropy_band_patience: int = field(
        default=20, metadata={"help": "Warn (once) when entropy stays outside the band this many steps in a row."})

    # TRL turns checkpointing on through `gradient_checkpointing`, which transformers 5 deprecates (a FutureWarning
    # at every start); the same default is set here through the current name, `activation_checkpointing`.
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing (transformers 5)."}
    )
    activation_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Recompute activations in the backward pass to save memory (default: on, as TRL's GRPO)."},
    )

    def __post_init__(self):
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True  # TRL's default, under the name transformers 5 reads
        if not self.use_cpu and not has_accelerator():
            # No GPU: train on the CPU (in float32 unless bf16 was asked for) instead of stopping at transformers'
            # "Your setup doesn't support bf16/gpu".
            self.use_cpu = True
            self.bf16 = False if self.bf16 is None else self.bf16
        check_non_negative(self, {
            "learning_rate": "a step size (e.g. 1e-6)",
            "epsilon": "the lower clip range of the ratio (TRL: 0.2)",
            "epsilon_high": "the upper clip range of the ratio",
            "ppl_shaping_alpha": "the weight of STILL's perplexity shaping (paper: 0.01; 0 switches it off)",
            "position_bonus_gamma": "the weight of STILL's position bonus (paper: 0.1; 0 switches it off)",
        })
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature is {self.temperature} but must be > 0: GRPO learns from sampled completions "
                             "(TRL's default: 1.0)")
        super().__post_init__()
        if self.position_bonus_num_steps is not None and self.position_bonus_num_steps < 0:
            raise ValueError(f"position_bonus_num_steps must be >= 0 or None, got {self.position_bonus_num_steps}")
        check_position_bonus_shape(self.position_bonus_direction, self.position_bonus_scale, self.position_bonus_center)
        check_dynamic_sampling(self)
        if not 0.0 < self.exploration_metrics_top_p <= 1.0:
            raise ValueError(f"exploration_metrics_top_p must be in (0, 1], got {self.exploration_metrics_top_p}")
        check_choice(self, "exploration_metrics_lambda", EXPLORATION_LAMBDA_MODES)
        from .components.heldout_eval import check_heldout_config
        from .callbacks.divergence import check_divergence_config

        check_heldout_config(self)
        check_divergence_config(self)
        from .callbacks.entropy_band import check_entropy_band

        check_entropy_band(self)


def has_accelerator() -> bool:
    """True when torch sees a GPU (CUDA, ROCm, Apple MPS) or an Intel XPU."""
    xpu = getattr(torch, "xpu", None)
    return bool(torch.cuda.is_available() or torch.backends.mps.is_available() or (xpu and xpu.is_available()))


def check_non_negative(config, meanings: dict[str, str]):
    """Raise a one-line `ValueError` naming the first of `meanings`' keys whose value is negative (None is unset)."""
    for name, meaning in meanings.items():
        value = getattr(config, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"{name} is {value} but must be >= 0: it is {meaning}")


def check_choice(config, name: str, choices) -> None:
    """Raise a one-line `ValueError` when the key `name` holds a value outside `choices`, listing the valid ones."""
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def check_sum_then_normalize(config, method: str) -> None:
    """One-line error when a method that recomputes advantages from the summed rewards (as TRL's default
    `multi_objective_aggregation: sum_then_normalize` does) is given another aggregation."""
    aggregation = getattr(config, "multi_objective_aggregation", "sum_then_normalize")
    if aggregation != "sum_then_normalize":
        raise ValueError(f"multi_objective_aggregation is {aggregation!r} but method {method} recomputes advantages "
                         "from the summed rewards; set multi_objective_aggregation: sum_then_normalize")


DYNAMIC_SAMPLING_ON_EXHAUSTED = ("fill", "error")


def check_dynamic_sampling(config):
    """One-line errors for the dynamic-sampling keys (see `trainers/components/dynamic_sampling.py`)."""
    check_choice(config, "dynamic_sampling_metric", DYNAMIC_SAMPLING_METRICS)
    check_choice(config, "dynamic_sampling_on_exhausted", DYNAMIC_SAMPLING_ON_EXHAUSTED)
    rounds = config.dynamic_sampling_max_rounds
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"dynamic_sampling_max_rounds is {rounds!r} but must be an integer >= 0: the most extra "
                         "generation rounds per batch (verl's DAPO recipe: 10)")


#: The plain trainer's record (`ExplorationGRPOTrainer` registers it, first, as `grpo`).
GRPO_INFO = MethodInfo(
    name="grpo", side="none", display="GRPO",
    summary="TRL's GRPO unchanged, plus exploration metrics",
    description="Group Relative Policy Optimization: advantages are rewards normalised within the group of "
                "completions sampled for the same prompt.",
    paper=arxiv_paper(
        "shao2024deepseekmath",
        "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models", "Shao et al., 2024",
        ["Zhihong Shao", "Peiyi Wang", "Qihao Zhu", "Runxin Xu", "Junxiao Song", "Xiao Bi", "Haowei Zhang",
         "Mingchuan Zhang", "Y. K. Li", "Y. Wu", "Daya Guo"], 2024, "2402.03300", "cs.CL"),
    where="DeepSeekMath GRPO, as TRL 1.16",
    changes="nothing: exactly TRL's `GRPOTrainer` (tested to 1e-6) plus exploration metrics",
    knobs_note="TRL's",
)

"""DS-GRPO, differential smoothing (seed "Differential Smoothing Mitigates Sharpening", Sec. 3.5 / 4.2, App. B.3)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...core import advantages as core_adv
from ...core.utils import broadcast_advantages, masked_sum
from ...methods import MethodInfo, arxiv_paper, register_method
from ...rewards.base import is_correct
from ..base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch, check_choice, check_non_negative
from ..components.window_warning import WindowWarning
from ..strategy import AdvantageStrategy

#: The share of (process, generation batch) pairs whose smoothing shift outweighed GRPO's advantages.
SHIFT_EXCEEDS = "dsgrpo/shift_exceeds_advantage_frac"


def _window_mean(window: dict, name: str) -> float:
    """The mean of a metric's values since the last log; `.get`, so that reading adds no empty list (which TRL's
    `log` would try to average)."""
    values = window.get(name) or []
    return sum(values) / max(len(values), 1)


@dataclass
class DSGRPOConfig(ExplorationGRPOConfig):
    """DS-GRPO: an entropy bonus on correct completions (`A - gamma_p * L`) and a penalty on wrong ones
    (`A + gamma_n * L`), `L` the rollout policy's log-probability at `ds_logp_granularity` (default: the trajectory's,
    log pi_old(y|x), as the paper states it). The paper's Qwen2.5-Math tables: gamma_p = gamma_n = 0.01,
    `epsilon_high=0.25` (no code of the authors is public). `ds_gamma_n=0` is DS-GRPO-Positive, `ds_gamma_p=0`
    DS-GRPO-Negative (Sec. 4.6)."""

    ds_gamma_p: float = field(default=0.01, metadata={"help": "Entropy-bonus weight on correct completions."})
    ds_gamma_n: float = field(default=0.01, metadata={"help": "Entropy-penalty weight on wrong completions."})
    ds_logp_granularity: str = field(
        default="sequence_sum",
        metadata={"help": "Which log-probability L the smoothing uses: 'sequence_sum' (default: the trajectory "
                  "log-prob log pi_old(y|x), the paper's form, one shift for every token of a completion), 'token' "
                  "(each token's own log pi_old(o_t): a per-state entropy bonus that drops the cross-token terms, an "
                  "approximation with a different gradient) or 'sequence_mean' (length-averaged, 0.1.x behaviour)."},
    )
    epsilon_high: float | None = field(default=0.25, metadata={"help": "Upper clip: ratio <= 1 + epsilon_high."})

    def __post_init__(self):
        super().__post_init__()
        check_non_negative(self, {
            "ds_gamma_p": "the weight of the entropy bonus on correct completions (paper: 0.01; 0 switches it off)",
            "ds_gamma_n": "the weight of the entropy penalty on wrong completions (paper: 0.01; 0 switches it off)",
        })
        check_choice(self, "ds_logp_granularity", core_adv.DSGRPO_GRANULARITIES)


@register_method(MethodInfo(
    name="dsgrpo", side="advantage", display="DS-GRPO (differential smoothing)",
    summary="DS-GRPO: entropy bonus on correct completions, penalty on wrong ones",
    description="An entropy bonus on correct completions and an entropy penalty on wrong ones, through each "
                "completion's log-probability (`ds_logp_granularity`: the trajectory's sum by default, or per token, "
                "or the mean).",
    paper=arxiv_paper(
        "gai2025differential", "Differential Smoothing Mitigates Sharpening and Improves LLM Reasoning",
        "Gai et al., 2025", ["Jingchu Gai", "Guanning Zeng", "Huaqing Zhang", "Aditi Raghunathan"], 2025,
        "2511.19942", "cs.LG"),
    config_prefixes=("ds_",), metric_prefixes=("dsgrpo/",),
    coefficients={"ds_gamma_p": 1, "ds_gamma_n": 0}, published={"ds_gamma_p": 0.01, "ds_gamma_n": 0.01},
    where="Sec. 3.5/4.2, App. B.3",
    changes=("entropy bonus on correct completions (`A − γp·log π_old(y|x)`), penalty on wrong ones (`A + γn·log "
             "π_old(y|x)`), the trajectory's log-prob, one shift for all its tokens"),
))
class DSGRPO(AdvantageStrategy):
    """Advantage-side: differential smoothing with the rollout policy's log-probabilities."""

    config_class = DSGRPOConfig
    window_warnings = (WindowWarning(SHIFT_EXCEEDS, lambda ctx, values: _shift_dominates(ctx),
                                     modes=("train",)),)

    def needs_rollout_logps(self) -> bool:
        return True

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        ctx, args = self.ctx, self.args
        rewards = batch.local_rewards
        mask = batch.completion_mask
        new = core_adv.dsgrpo_advantages(
            advantages, rewards, batch.completion_logps, mask,
            gamma_p=args.ds_gamma_p, gamma_n=args.ds_gamma_n,
            correct_threshold=args.correct_reward_threshold, granularity=args.ds_logp_granularity,
        )
        # Per-token change on valid tokens (a sequence-level change counts once per token of its row).
        shape = mask.shape
        delta = (broadcast_advantages(new, shape) - broadcast_advantages(advantages, shape)) * mask
        right = is_correct(rewards, args.correct_reward_threshold)[:, None]
        ctx.guard_correctness(batch.rewards, is_correct(batch.rewards, args.correct_reward_threshold),
                          batch.num_generations, "dsgrpo", "DS-GRPO gives every completion the same side of its "
                          "smoothing (the bonus of correct ones, or the penalty of wrong ones)")
        valid = mask.bool()
        correct, wrong = right & valid, ~right & valid
        # Sums and counts on the device, reduced across processes and read at the next log (no host read here): mean
        # bonus on correct tokens, mean penalty on wrong tokens, the size of the shift against GRPO's advantages, and
        # whether the shift outweighed them on this process and step (the warning's trigger, read at the log).
        shift_abs = masked_sum(delta.abs(), valid)
        adv_abs = masked_sum(broadcast_advantages(advantages, shape).abs(), valid)
        n_valid = valid.sum()
        ctx.queue_metrics({
            "dsgrpo/bonus_mean": (masked_sum(delta, correct), correct.sum()),
            "dsgrpo/penalty_mean": (masked_sum(delta, wrong), wrong.sum()),
            "dsgrpo/shift_abs_mean": (shift_abs, n_valid),
            "dsgrpo/advantage_abs_mean": (adv_abs, n_valid),
            SHIFT_EXCEEDS: (((shift_abs > adv_abs) & (adv_abs != 0)).float(), 1.0),
        })
        return new


def _shift_dominates(ctx) -> str:
    """The smoothing term outweighed GRPO's advantages (the trajectory log-prob grows with length)."""
    window = ctx.metrics_window("train")
    frac, shift, adv = (_window_mean(window, name) for name in (
        SHIFT_EXCEEDS, "dsgrpo/shift_abs_mean", "dsgrpo/advantage_abs_mean"))
    granularity = ctx.args.ds_logp_granularity
    return (
        f"DS-GRPO: the smoothing shift outweighed GRPO's advantages on {frac:.0%} of the generation batches since "
        f"the last log (their means: |gamma * L| {shift:.3g} per token, |A| {adv:.3g}). With ds_logp_granularity="
        f"{granularity} L is "
        + ("the completion's log-probability, a sum that grows with its length, so long completions are ranked "
           "by log-probability more than by reward. " if granularity == "sequence_sum" else
           "the rollout log-probability. ")
        + "Lower ds_gamma_p / ds_gamma_n, or set ds_logp_granularity: sequence_mean or token (README). Shown "
        f"once; logged every step as dsgrpo/shift_abs_mean, dsgrpo/advantage_abs_mean and {SHIFT_EXCEEDS}."
    )


class DSGRPOTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with DS-GRPO's differential smoothing (the `DSGRPO` strategy)."""

    method = "dsgrpo"

"""DS-GRPO, differential smoothing (seed "Differential Smoothing Mitigates Sharpening", Sec. 3.5 / 4.2, App. B.3)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from ..core import advantages as core_adv
from ..core._utils import broadcast_advantages
from ..methods import MethodInfo, arxiv_paper, register_method
from ..rewards._base import is_correct
from .base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch, check_choice, check_non_negative
from .correctness_guard import guard_correctness


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
))
class DSGRPOTrainer(ExplorationGRPOTrainer):
    """Advantage-side: differential smoothing with the rollout policy's log-probabilities."""

    config_class = DSGRPOConfig

    def _needs_rollout_logps(self) -> bool:
        return True

    def _compute_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        advantages = super()._compute_advantages(batch)
        self._mark_hook_ran("dsgrpo")
        rewards = batch.local_rewards
        mask = batch.completion_mask
        new = core_adv.dsgrpo_advantages(
            advantages, rewards, batch.completion_logps, mask,
            gamma_p=self.args.ds_gamma_p, gamma_n=self.args.ds_gamma_n,
            correct_threshold=self.args.correct_reward_threshold, granularity=self.args.ds_logp_granularity,
        )
        # Per-token change on valid tokens (a sequence-level change counts once per token of its row).
        shape = mask.shape
        delta = (broadcast_advantages(new, shape) - broadcast_advantages(advantages, shape)) * mask
        right = is_correct(rewards, self.args.correct_reward_threshold)[:, None]
        guard_correctness(self, batch.rewards, is_correct(batch.rewards, self.args.correct_reward_threshold),
                          batch.num_generations, "dsgrpo", "DS-GRPO gives every completion the same side of its "
                          "smoothing (the bonus of correct ones, or the penalty of wrong ones)")
        correct, wrong = right & mask.bool(), ~right & mask.bool()
        valid = mask.bool()
        shift_abs = delta.abs()[valid].sum().item()
        adv_abs = (broadcast_advantages(advantages, shape).abs() * mask)[valid].sum().item()
        n_valid = valid.sum().item()
        # Sums and counts, reduced across processes: mean bonus on correct tokens, mean penalty on wrong tokens, and
        # the size of the shift against GRPO's advantages.
        self._log_loss_state_metrics({"metrics": {
            "dsgrpo/bonus_mean": (delta[correct].sum().item(), correct.sum().item()),
            "dsgrpo/penalty_mean": (delta[wrong].sum().item(), wrong.sum().item()),
            "dsgrpo/shift_abs_mean": (shift_abs, n_valid),
            "dsgrpo/advantage_abs_mean": (adv_abs, n_valid),
        }})
        self._warn_if_shift_dominates(shift_abs / max(n_valid, 1), adv_abs / max(n_valid, 1))
        return new

    def _warn_if_shift_dominates(self, shift: float, adv: float):
        """Once per run: the smoothing term outweighs GRPO's advantages (the trajectory log-prob grows with length)."""
        if shift <= adv or adv == 0.0 or getattr(self, "_warned_shift", False):
            return
        self._warned_shift = True
        warnings.warn(
            f"DS-GRPO: the smoothing shift (mean |gamma * L| {shift:.3g} per token) is larger than GRPO's advantages "
            f"(mean |A| {adv:.3g}) on this step. With ds_logp_granularity={self.args.ds_logp_granularity} L is "
            + ("the completion's log-probability, a sum that grows with its length, so long completions are ranked "
               "by log-probability more than by reward. " if self.args.ds_logp_granularity == "sequence_sum" else
               "the rollout log-probability. ")
            + "Lower ds_gamma_p / ds_gamma_n, or set ds_logp_granularity: sequence_mean or token (README). Shown "
            "once; logged every step as dsgrpo/shift_abs_mean and dsgrpo/advantage_abs_mean.",
            UserWarning, stacklevel=2,
        )

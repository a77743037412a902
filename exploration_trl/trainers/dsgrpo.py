"""DS-GRPO, differential smoothing (seed "Differential Smoothing Mitigates Sharpening", Sec. 3.5 / 4.2, App. B.3)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core import advantages as core_adv
from .base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch


@dataclass
class DSGRPOConfig(ExplorationGRPOConfig):
    """DS-GRPO: an entropy bonus on correct completions (`A - gamma_p * lbar`) and a penalty on wrong ones
    (`A + gamma_n * lbar`). Authors' scripts: gamma_p = gamma_n = 0.01, `epsilon_high=0.25`.
    `ds_gamma_n=0` is DS-GRPO-Positive, `ds_gamma_p=0` DS-GRPO-Negative (Sec. 4.6)."""

    ds_gamma_p: float = field(default=0.01, metadata={"help": "Entropy-bonus weight on correct completions."})
    ds_gamma_n: float = field(default=0.01, metadata={"help": "Entropy-penalty weight on wrong completions."})
    epsilon_high: float | None = field(default=0.25, metadata={"help": "Upper clip: ratio <= 1 + epsilon_high."})


class DSGRPOTrainer(ExplorationGRPOTrainer):
    """Advantage-side: differential smoothing with the rollout policy's length-averaged log-prob."""

    config_class = DSGRPOConfig
    method_name = "dsgrpo"

    def _needs_rollout_logps(self) -> bool:
        return True

    def _compute_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        advantages = super()._compute_advantages(batch)
        rewards = batch.local_rewards
        new = core_adv.dsgrpo_advantages(
            advantages, rewards, batch.completion_logps, batch.completion_mask,
            gamma_p=self.args.ds_gamma_p, gamma_n=self.args.ds_gamma_n,
            correct_threshold=self.args.correct_reward_threshold,
        )
        delta = new - advantages.float()
        correct = rewards > self.args.correct_reward_threshold
        # Sums and counts, reduced across processes: mean bonus on correct rows, mean penalty on wrong rows.
        self._log_loss_state_metrics({"metrics": {
            "dsgrpo/bonus_mean": (delta[correct].sum().item(), correct.sum().item()),
            "dsgrpo/penalty_mean": (delta[~correct].sum().item(), (~correct).sum().item()),
        }})
        return new

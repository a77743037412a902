"""MaxRL (Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning", Algorithm 1, Eq. 10, App. F)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core import estimators as core_est
from ..core._utils import masked_sum
from ..methods import MethodInfo, arxiv_paper, register_method
from ..rewards._base import is_correct
from .base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch, check_non_negative
from .config import check_sum_then_normalize
from .correctness_guard import guard_correctness
from .window_warning import WindowWarning
from .strategy import AdvantageStrategy

#: 1 for a generation batch whose advantages were all 0 (every group all correct or all wrong).
ZERO_BATCH = "maxrl/zero_advantage_batch_frac"


@dataclass
class MaxRLConfig(ExplorationGRPOConfig):
    """MaxRL: advantages normalised by the group's mean reward instead of its standard deviation,
    `A = (r - r_hat) / (r_hat + maxrl_eps)` on binary rewards (correct: total reward > `correct_reward_threshold`).
    A group without a correct completion gets 0 (Algorithm 1). TRL's `scale_rewards` does not apply: the mean is
    MaxRL's normalisation. The paper's Qwen3 runs are fully on-policy (one update per rollout), as TRL's default."""

    maxrl_eps: float = field(
        default=1e-6,
        metadata={"help": "Added to the group's mean reward before dividing (the authors' code and App. F: 1e-6; 0 is "
                  "Algorithm 1 exactly). A group with mean 0 gets 0 either way."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_maxrl_options(self)
        check_sum_then_normalize(self, "maxrl")


def check_maxrl_options(config) -> None:
    """The checks on MaxRL's own keys, for `MaxRLConfig` and for any other front end that reads the same keys
    (`exploration_trl.integrations.verl`)."""
    check_non_negative(config, {"maxrl_eps": "added to the group's mean reward before dividing (paper: 1e-6)"})


def _zero_batches(trainer, values: list[float]) -> str:
    share = sum(v > 0 for v in values) / len(values)
    return (f"maxrl: every group of {share:.0%} of the generation batches since the last log was all correct or all "
            f"wrong (correct: total reward > {trainer.args.correct_reward_threshold}), so MaxRL's advantages were all "
            "0 and those batches taught nothing (logged as maxrl/zero_advantage_batch_frac and "
            "maxrl/zero_mean_groups). Harder or easier prompts, or more num_generations, give mixed groups. Warned "
            "once.")


@register_method(MethodInfo(
    name="maxrl", side="advantage", display="MaxRL (Maximum Likelihood RL)",
    summary="MaxRL: advantages normalised by the group's mean reward (maximum likelihood)",
    description="Binary-reward advantages normalised by the group's success rate instead of its standard deviation, "
                "which makes the update an estimate of the gradient of the log-likelihood of success (a weighted sum "
                "of pass@k gradients) rather than of pass@1.",
    paper=arxiv_paper(
        "tajwar2026maxrl", "Maximum Likelihood Reinforcement Learning", "Tajwar et al., 2026",
        ["Fahim Tajwar", "Guanning Zeng", "Yueer Zhou", "Yuda Song", "Daman Arora", "Yiding Jiang", "Jeff Schneider",
         "Ruslan Salakhutdinov", "Haiwen Feng", "Andrea Zanette"], 2026, "2602.02710", "cs.LG"),
    config_prefixes=("maxrl_",), metric_prefixes=("maxrl/",),
    coefficients={}, published={"maxrl_eps": 1e-6},
    where="Algorithm 1, Eq. 10, App. F",
    changes=("binary-reward advantages normalised by the group's mean reward instead of its std, `A = (r − r̂)/(r̂ + "
             "ε)`: correct `G/K − 1`, wrong `−1`, a group without a correct completion 0; correctness by "
             "`correct_reward_threshold`"),
))
class MaxRL(AdvantageStrategy):
    """Advantage-side: MaxRL's mean-normalised advantages from each group's correct count (`core.maxrl_advantages`)."""

    config_class = MaxRLConfig
    window_warnings = (WindowWarning(ZERO_BATCH, _zero_batches),)

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        t = self.trainer  # TRL's advantages are replaced, not shifted
        t.mark_hook_ran("maxrl")
        rewards, g = batch.rewards, batch.num_generations
        correct = is_correct(rewards, self.args.correct_reward_threshold)
        guard_correctness(t, rewards, correct, g, "maxrl", "MaxRL's advantages are all 0 and it learns nothing")
        valid = ~torch.isnan(rewards)
        adv = core_est.maxrl_advantages(correct, g, valid=valid, eps=self.args.maxrl_eps)
        groups = (correct & valid).view(-1, g)
        local = adv.to(batch.advantages.device)[batch.process_slice]
        t.queue_metrics({  # global already (the gathered rewards): kept on the device until the log
            "maxrl/zero_mean_groups": ((~groups.any(dim=1)).sum(), groups.size(0)),
            "maxrl/adv_correct_mean": (masked_sum(adv, correct & valid), (correct & valid).sum()),
            ZERO_BATCH: ((adv == 0).all().double(), 1.0),
        }, reduce=False)
        return local


class MaxRLTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with MaxRL's advantages (the `MaxRL` strategy)."""

    method = "maxrl"

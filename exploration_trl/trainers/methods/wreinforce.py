"""Weighted REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning",
Sec. 5, Eq. 9), with its PSR-only and NSR-only objectives (Sec. 2.2, Eq. 3 and 4; trained in Sec. 3)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...core import estimators as core_est
from ...methods import MethodInfo, arxiv_paper, register_method
from ...rewards.base import is_correct
from ..base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch, check_choice, check_non_negative
from ..config import check_sum_then_normalize
from ..components.window_warning import WindowWarning
from ..strategy import AdvantageStrategy

#: 1 for a generation batch whose advantages were all 0 (PSR without a correct completion, NSR without a wrong one).
ZERO_BATCH = "wreinforce/zero_advantage_batch_frac"


@dataclass
class WReinforceConfig(ExplorationGRPOConfig):
    """W-REINFORCE: `lambda * L_PSR + L_NSR`, i.e. advantage `wreinforce_lambda` for a correct completion and -1 for a
    wrong one (correct: total reward > `correct_reward_threshold`), no baseline and no normalisation (TRL's
    `scale_rewards` does not apply). The paper trains with PPO's clipped loss (clip 0.2), lambda = 0.1, four
    updates per rollout (1,024 prompts, mini-batches of 256) and an entropy bonus of 1e-4 (App. C.1): TRL's
    `entropy_coef`, which the recipe sets (the config keeps TRL's 0, as every training set-up stays in recipes)."""

    wreinforce_lambda: float = field(
        default=0.1, metadata={"help": "Weight lambda of the positive samples (paper: 0.1; 1 is REINFORCE with +1/-1 "
                                       "rewards, 0 is NSR)."})
    wreinforce_mode: str = field(
        default="weighted",
        metadata={"help": "'weighted' (W-REINFORCE), 'psr' (positive samples only: +1 and 0) or 'nsr' (negative "
                  "samples only: 0 and -1). The authors' code drops the other samples from the batch; here they stay "
                  "with advantage 0, so they still count in loss_type's token normalisation."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_wreinforce_options(self)
        check_sum_then_normalize(self, "wreinforce")


def check_wreinforce_options(config) -> None:
    """The checks on W-REINFORCE's own keys, for `WReinforceConfig` and for any other front end that reads the same
    keys (`exploration_trl.integrations.verl`)."""
    check_non_negative(config, {"wreinforce_lambda": "the weight of the positive samples (paper: 0.1)"})
    check_choice(config, "wreinforce_mode", core_est.WREINFORCE_MODES)


def _zero_batches(ctx, values: list[float]) -> str:
    share = sum(v > 0 for v in values) / len(values)
    mode = ctx.args.wreinforce_mode
    why = {"psr": "had no correct completion (wreinforce_mode: psr trains on correct ones only)",
           "nsr": "had no wrong completion (wreinforce_mode: nsr trains on wrong ones only)",
           "weighted": "had only correct completions and wreinforce_lambda is 0"}[mode]
    return (f"wreinforce: {share:.0%} of the generation batches since the last log {why}, so their advantages were all "
            f"0 and they taught nothing (logged as {ZERO_BATCH}; correct: total reward > "
            f"{ctx.args.correct_reward_threshold}). Warned once.")


@register_method(MethodInfo(
    name="wreinforce", side="advantage", display="W-REINFORCE (weighted REINFORCE)",
    summary="W-REINFORCE: REINFORCE with +1/-1 rewards, correct samples down-weighted (lambda)",
    description="REINFORCE with +1 for a correct completion and -1 for a wrong one, no baseline, and the correct "
                "completions down-weighted by lambda, so that most of the learning signal lowers the probability of "
                "wrong answers (negative sample reinforcement) and keeps the rest of the distribution.",
    paper=arxiv_paper(
        "zhu2025negative", "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning",
        "Zhu et al., 2025",
        ["Xinyu Zhu", "Mengzhou Xia", "Zhepei Wei", "Wei-Lin Chen", "Danqi Chen", "Yu Meng"], 2025, "2506.01347",
        "cs.LG"),
    config_prefixes=("wreinforce_",), metric_prefixes=("wreinforce/",),
    coefficients={"wreinforce_lambda": 0}, published={"wreinforce_lambda": 0.1, "wreinforce_mode": "weighted"},
    where="Sec. 5, Eq. 9 (PSR/NSR: Sec. 2.2, Eq. 3–4)",
    changes=("REINFORCE with +1/−1 rewards and no baseline, the correct completions weighted by λ: advantage `λ` "
             "(correct) or `−1` (wrong); `psr` / `nsr` keep one side"),
))
class WReinforce(AdvantageStrategy):
    """Advantage-side: W-REINFORCE's constant advantages per correctness class
    (`core.weighted_reinforce_advantages`)."""

    config_class = WReinforceConfig
    window_warnings = (WindowWarning(ZERO_BATCH, _zero_batches),)

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        ctx, a = self.ctx, self.args  # TRL's advantages are replaced
        rewards = batch.rewards
        correct = is_correct(rewards, a.correct_reward_threshold)
        ctx.guard_correctness(rewards, correct, batch.num_generations, "wreinforce",
                          "W-REINFORCE gives every completion the same advantage, so it moves the likelihood of every "
                          "sample alike")
        valid = ~torch.isnan(rewards)
        adv = core_est.weighted_reinforce_advantages(correct, valid, a.wreinforce_lambda, a.wreinforce_mode)
        ctx.queue_metrics({  # global already (the gathered rewards): kept on the device until the log
            "wreinforce/correct_frac": ((correct & valid).sum(), valid.sum()),
            "wreinforce/adv_mean": (adv.sum(), valid.sum()),
            ZERO_BATCH: ((adv == 0).all().double(), 1.0),
        }, reduce=False)
        return adv.to(batch.advantages.device)[batch.process_slice]


class WReinforceTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with W-REINFORCE's advantages (the `WReinforce` strategy)."""

    method = "wreinforce"

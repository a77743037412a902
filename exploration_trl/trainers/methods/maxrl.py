"""MaxRL (Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning", Eq. 11, Algorithm 1, App. F)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...core import estimators as core_est
from ...core.utils import masked_sum
from ...methods import MethodInfo, arxiv_paper, register_method
from ...rewards.base import is_correct
from ..base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch, check_non_negative
from ..config import check_sum_then_normalize
from ..components.window_warning import WindowWarning
from ..strategy import AdvantageStrategy

#: 1 for a generation batch whose advantages were all 0 (every group all correct or all wrong).
ZERO_BATCH = "maxrl/zero_advantage_batch_frac"


@dataclass
class MaxRLConfig(ExplorationGRPOConfig):
    """MaxRL: advantages normalised by the group's mean reward instead of its standard deviation,
    `A = (r - r_hat) / (r_hat + maxrl_eps)` on binary rewards (correct: total reward > `correct_reward_threshold`).
    A group without a correct completion gets 0 (Algorithm 1). TRL's `scale_rewards` does not apply: the mean is
    MaxRL's normalisation. The paper's Qwen3 runs are fully on-policy (one update per rollout), as TRL's default.

    The update is an unbiased estimate of the truncated maximum-likelihood gradient (Thm. 2) only when the loss weighs
    every completion of a prompt alike and each rollout feeds one update: `loss_type` `dapo` (the default), `dr_grpo`,
    `cispo`, `luspo` or `vespo` (`bnpo` with one micro-batch per step), and `steps_per_generation ==
    gradient_accumulation_steps` with `num_iterations: 1`. `loss_type` `grpo` or `sapo` (each completion's loss
    divided by its own length), `bnpo` over several micro-batches and several updates per rollout are accepted, with
    one warning each (docs/math.md)."""

    maxrl_eps: float = field(
        default=1e-6,
        metadata={"help": "Added to the group's mean reward before dividing (the authors' code: 1e-6; 0 is Algorithm 1 "
                  "exactly). A group with mean 0 gets 0 either way."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_maxrl_options(self)
        check_sum_then_normalize(self, "maxrl")


def check_maxrl_options(config) -> None:
    """The checks on MaxRL's own keys, for `MaxRLConfig` and for any other front end that reads the same keys
    (`exploration_trl.integrations.verl`)."""
    check_non_negative(config, {"maxrl_eps": "added to the group's mean reward before dividing (the authors' code: "
                                             "1e-6)"})


#: `loss_type`s that divide each completion's loss by its own length: completions of one prompt weigh unequally.
LENGTH_WEIGHTED_LOSSES = ("grpo", "sapo")


def _zero_batches(ctx, values: list[float]) -> str:
    share = sum(v > 0 for v in values) / len(values)
    return (f"maxrl: every group of {share:.0%} of the generation batches since the last log was all correct or all "
            f"wrong (correct: total reward > {ctx.args.correct_reward_threshold}), so MaxRL's advantages were all "
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
    where="Eq. 11, Algorithm 1; ε: the authors' code",
    changes=("binary-reward advantages normalised by the group's mean reward instead of its std, `A = (r − r̂)/(r̂ + "
             "ε)`: correct `G/K − 1`, wrong `−1`, a group without a correct completion 0; correctness by "
             "`correct_reward_threshold`; unbiased (Thm. 2) on-policy with a loss that weighs a prompt's completions "
             "alike, one warning otherwise"),
))
class MaxRL(AdvantageStrategy):
    """Advantage-side: MaxRL's mean-normalised advantages from each group's correct count (`core.maxrl_advantages`)."""

    config_class = MaxRLConfig
    window_warnings = (WindowWarning(ZERO_BATCH, _zero_batches),)

    def __init__(self, ctx):
        super().__init__(ctx)
        # Thm. 2's unbiasedness needs each prompt's gradient to be sum_j A_j grad log pi(o_j) up to a factor shared by
        # the prompt's completions, from samples of the policy being updated: say once when the settings break it.
        args = ctx.args
        if args.loss_type in LENGTH_WEIGHTED_LOSSES:
            why = (f"loss_type '{args.loss_type}' divides each completion's loss by its own length, so the completions "
                   "of a prompt are weighted by 1/length")
        elif args.loss_type == "bnpo" and max(args.gradient_accumulation_steps, ctx.num_processes) > 1:
            why = ("loss_type 'bnpo' divides each micro-batch's loss by that micro-batch's own token count, so the "
                   "completions of a prompt that land in different micro-batches are weighted differently")
        else:
            why = None
        if why:
            ctx.warn_once(
                "maxrl_unequal_weights",
                f"maxrl: {why}, and MaxRL's update is no longer the unbiased estimate of the maximum-likelihood "
                "gradient (the paper's Thm. 2). loss_type dapo (the default), dr_grpo, cispo, luspo or vespo keep it. "
                "Warned once.",
            )
        updates = ctx.updates_per_rollout()
        if updates > 1:
            ctx.warn_once(
                "maxrl_off_policy",
                f"maxrl: each rollout feeds {updates:g} optimizer updates (steps_per_generation x num_iterations / "
                "gradient_accumulation_steps), so every update after the first uses samples of an older policy; the "
                "paper's unbiasedness (Thm. 2) is for on-policy samples, and its Qwen3 runs make one update per "
                "rollout. Warned once.",
            )

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx  # TRL's advantages are replaced, not shifted
        rewards, g = batch.rewards, batch.num_generations
        correct = is_correct(rewards, self.args.correct_reward_threshold)
        ctx.guard_correctness(rewards, correct, g, "maxrl", "MaxRL's advantages are all 0 and it learns nothing")
        valid = ~torch.isnan(rewards)
        adv = core_est.maxrl_advantages(correct, g, valid=valid, eps=self.args.maxrl_eps)
        groups = (correct & valid).view(-1, g)
        local = adv.to(batch.advantages.device)[batch.process_slice]
        ctx.queue_metrics({  # global already (the gathered rewards): kept on the device until the log
            "maxrl/zero_mean_groups": ((~groups.any(dim=1)).sum(), groups.size(0)),
            "maxrl/adv_correct_mean": (masked_sum(adv, correct & valid), (correct & valid).sum()),
            ZERO_BATCH: ((adv == 0).all().double(), 1.0),
        }, reduce=False)
        return local


class MaxRLTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with MaxRL's advantages (the `MaxRL` strategy)."""

    method = "maxrl"

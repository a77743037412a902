"""Pass@k-objective methods (advantage side): Pass@k Training (`passk`), PKPO (`pkpo`) and the unlikeliness reward
(`unlikely`). Each recomputes the advantages from the rewards of the whole generation batch (every process holds
them, gathered by TRL), so each process computes the same global advantages and keeps its own rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...core import passk as core_pk
from ...core.utils import masked_sum
from ...core.advantages import group_advantages
from ...methods import MethodInfo, arxiv_paper, register_method
from ...rewards.base import is_correct
from ..base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch, check_choice, check_non_negative
from ..config import check_sum_then_normalize
from ..strategy import AdvantageStrategy

__all__ = ["PasskConfig", "PasskTrainer", "PKPOConfig", "PKPOTrainer", "UnlikelyConfig", "UnlikelyTrainer"]


def _check_k(config, name: str):
    k = getattr(config, name)
    if k is None or int(k) != k or k < 1:
        raise ValueError(f"{name} is {k!r} but must be an integer >= 1 (1 is pass@1, i.e. GRPO's objective)")
    g = getattr(config, "num_generations", None)
    if g is not None and k > g:
        raise ValueError(f"{name} is {k} but num_generations is {g}: pass@k needs k <= num_generations; lower {name} "
                         "or raise num_generations")


@dataclass
class PasskConfig(ExplorationGRPOConfig):
    """Pass@k Training (Chen et al. 2025, arXiv 2508.10751): analytic pass@k advantages for correct and wrong
    completions (`core.passk`). Correctness is `correct_reward_threshold` on the total reward. The
    division by the subsets' reward std follows TRL's `scale_rewards` ("none" drops it; "group"/"batch" keep the
    paper's analytic per-group std)."""

    passk_k: int = field(default=4, metadata={"help": "k of the pass@k objective (1 <= k <= num_generations; 1 is "
                                                      "GRPO's binary-reward objective with the population std; 4 is "
                                                      "our choice, the paper studies several k)."})

    def __post_init__(self):
        super().__post_init__()
        check_passk_options(self)
        check_sum_then_normalize(self, "passk")


def check_passk_options(config) -> None:
    """The checks on Pass@k Training's own keys (`passk_k`, against `num_generations`), for `PasskConfig` and for any
    other front end that reads the same keys (`exploration_trl.integrations.verl`)."""
    _check_k(config, "passk_k")


@register_method(MethodInfo(
    name="passk", side="advantage", display="Pass@k Training",
    summary="Pass@k Training: analytic pass@k advantages for correct and wrong samples",
    description="Analytic pass@k advantages: each completion gets the mean advantage of the k-subsets of its group "
                "that contain it, so wrong completions in groups that already pass are penalised less (k in the "
                "config).",
    paper=arxiv_paper(
        "chen2025passk",
        "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large Reasoning Models",
        "Chen et al., 2025",
        ["Zhipeng Chen", "Xiaobo Qin", "Youbin Wu", "Yue Ling", "Qinghao Ye", "Wayne Xin Zhao", "Guang Shi"], 2025,
        "2508.10751"),
    config_prefixes=("passk_",), metric_prefixes=("passk/",),
    coefficients={"passk_k": 0}, chosen={"passk_k": 4},
    where="the analytic derivation",
    changes=("advantages of the pass@k objective: each completion gets the mean advantage of the k-subsets of its "
             "group containing it, `A_pos = (1 − R)/σ`, `A_neg = (1 − R − C(N_neg−1, k−1)/C(N−1, k−1))/σ`, `R = 1 − "
             "C(N_neg, k)/C(N, k)`, `σ = √(R(1−R))`; correctness by `correct_reward_threshold`"),
    knobs_note="(k ≤ G; 1 is GRPO's objective), σ follows TRL's `scale_rewards` (`none` drops it)",
))
class Passk(AdvantageStrategy):
    """Advantage-side: Pass@k Training's analytic advantages from each group's correct count."""

    config_class = PasskConfig

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        ctx, args = self.ctx, self.args  # TRL's advantages are replaced, not shifted
        rewards = batch.rewards
        correct = is_correct(rewards, args.correct_reward_threshold)
        ctx.guard_correctness(rewards, correct, batch.num_generations, "passk",
                          "Pass@k Training's advantages are all 0 and it learns nothing")
        adv = core_pk.passk_advantages(correct, batch.num_generations, args.passk_k,
                                       valid=~torch.isnan(rewards), scale=args.scale_rewards != "none")
        adv = adv.to(batch.advantages.device)[batch.process_slice]
        local_correct = correct[batch.process_slice].to(adv.device)
        local_wrong = ~local_correct
        ctx.queue_metrics({  # on the device until the next log: no host read on the step
            "passk/k": (float(args.passk_k), 1),
            "passk/adv_correct_mean": (masked_sum(adv, local_correct), local_correct.sum()),
            "passk/adv_wrong_mean": (masked_sum(adv, local_wrong), local_wrong.sum()),
            "passk/wrong_adv_positive_frac": (((adv > 0) & local_wrong).sum(), local_wrong.sum()),
        })
        return adv


class PasskTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with Pass@k Training's advantages (the `Passk` strategy)."""

    method = "passk"


@dataclass
class PKPOConfig(ExplorationGRPOConfig):
    """PKPO (Walder & Karkhanis 2025, arXiv 2505.15201): the unbiased pass@k / max@k reward transform for k <= G
    (`core.pkpo_transform`), with an optional k schedule toward `pkpo_k_final` (the paper's annealing)."""

    pkpo_k: int = field(default=4, metadata={"help": "k of the max@k objective (1 <= k <= num_generations; 4 is our "
                                                     "choice, the paper studies several k)."})
    pkpo_estimator: str = field(
        default="sloo_minus_one",
        metadata={"help": "'sloo_minus_one' (Eq. 33, the paper's lowest-variance baseline; default), 'sloo' (Eq. 29, "
                  "needs k < num_generations) or 's' (Eq. 19, no baseline: centred like GRPO's rewards; with k=1 "
                  "exactly GRPO)."},
    )
    pkpo_k_final: int | None = field(
        default=None, metadata={"help": "Anneal k toward this value (e.g. 1); None keeps pkpo_k throughout."})
    pkpo_k_anneal_steps: int = field(
        default=0, metadata={"help": "Step at which k switches to pkpo_k_final ('step'), or over which it moves "
                                     "linearly ('linear')."})
    pkpo_k_schedule: str = field(
        default="step", metadata={"help": "'step' (the paper's switch at pkpo_k_anneal_steps), 'linear' or "
                                          "'constant'. Only used when pkpo_k_final is set."})

    def __post_init__(self):
        super().__post_init__()
        check_pkpo_options(self)
        check_sum_then_normalize(self, "pkpo")


def check_pkpo_options(config) -> None:
    """The checks on PKPO's own keys (`pkpo_*`, against `num_generations`), for `PKPOConfig` and for any other front
    end that reads the same keys (`exploration_trl.integrations.verl`)."""
    _check_k(config, "pkpo_k")
    if config.pkpo_k_final is not None:
        _check_k(config, "pkpo_k_final")
    check_non_negative(config, {"pkpo_k_anneal_steps": "the step of PKPO's k annealing"})
    check_choice(config, "pkpo_estimator", core_pk.PKPO_ESTIMATORS)
    check_choice(config, "pkpo_k_schedule", core_pk.PKPO_K_SCHEDULES)
    g = config.num_generations
    if config.pkpo_estimator == "sloo" and g is not None and max(config.pkpo_k, config.pkpo_k_final or 1) >= g:
        raise ValueError(f"pkpo_estimator 'sloo' needs pkpo_k < num_generations ({g}); use sloo_minus_one")


@register_method(MethodInfo(
    name="pkpo", side="advantage", display="PKPO (Pass@K Policy Optimization)",
    summary="PKPO: unbiased pass@k reward transform for k < n, k optionally annealed",
    description="An unbiased transform of the group's rewards whose policy gradient is that of pass@k (max@k for "
                "graded rewards), with a leave-one-out baseline and k optionally annealed toward 1.",
    paper=arxiv_paper(
        "walder2025pkpo", "Pass@K Policy Optimization: Solving Harder Reinforcement Learning Problems",
        "Walder and Karkhanis, 2025", ["Christian Walder", "Deep Karkhanis"], 2025, "2505.15201"),
    config_prefixes=("pkpo_",), metric_prefixes=("pkpo/",),
    coefficients={"pkpo_k": 0}, chosen={"pkpo_k": 4},
    where="Eq. 12/19/29/33",
    changes=("the unbiased transform of the group's rewards whose gradient is pass@k's (max@k for graded rewards), "
             "then TRL's normalisation"),
))
class PKPO(AdvantageStrategy):
    """Advantage-side: PKPO's transformed rewards, normalised as TRL normalises rewards."""

    config_class = PKPOConfig

    def k_at(self, step: int) -> int:
        a = self.args
        return core_pk.pkpo_k_at_step(step, a.pkpo_k, a.pkpo_k_final, a.pkpo_k_anneal_steps, a.pkpo_k_schedule)

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        k = self.k_at(batch.global_step)
        adv = core_pk.pkpo_advantages(batch.rewards, batch.num_generations, k, self.args.pkpo_estimator,
                                      scale=self.args.scale_rewards)
        adv = adv.to(batch.advantages.device)[batch.process_slice]
        correct = is_correct(batch.local_rewards, self.args.correct_reward_threshold).to(adv.device)
        ctx.queue_metrics({  # on the device until the next log: no host read on the step
            "pkpo/k": (float(k), 1),
            "pkpo/adv_abs_mean": (adv.abs().sum(), adv.numel()),
            "pkpo/adv_wrong_mean": (masked_sum(adv, ~correct), (~correct).sum()),
        })
        return adv


class PKPOTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with PKPO's reward transform (the `PKPO` strategy)."""

    method = "pkpo"


@dataclass
class UnlikelyConfig(ExplorationGRPOConfig):
    """Unlikeliness reward (He et al. 2025, arXiv 2506.02355): a correct completion's reward is scaled by
    `1 - unlikely_beta * rank / G`, rank 0 for the least likely completion of its group under the rollout policy,
    then GRPO's group normalisation as TRL applies it (`core.unlikeliness_rewards`)."""

    unlikely_beta: float = field(default=0.25, metadata={"help": "Rank penalty beta_rank (paper: 0.25); 0 is GRPO."})
    unlikely_logp: str = field(
        default="mean", metadata={"help": "Likelihood the ranking uses: 'mean' token log-prob (the authors' released "
                                          "code; default) or 'sum' (the sequence log-likelihood)."})
    unlikely_rank_among: str = field(
        default="group", metadata={"help": "'group': rank all G completions, divide by G (released code; default); "
                                           "'correct': rank only the correct ones, divide by their count."})

    def __post_init__(self):
        super().__post_init__()
        check_non_negative(self, {"unlikely_beta": "the unlikeliness rank penalty (paper: 0.25; 0 switches it off)"})
        if self.unlikely_beta > 1:
            raise ValueError(f"unlikely_beta is {self.unlikely_beta} but must be <= 1, or the most likely correct "
                             "completion would get a negative reward (paper: 0.25)")
        check_choice(self, "unlikely_logp", core_pk.UNLIKELY_LOGPS)
        check_choice(self, "unlikely_rank_among", core_pk.UNLIKELY_RANK_AMONG)
        check_sum_then_normalize(self, "unlikely")


@register_method(MethodInfo(
    name="unlikely", side="advantage", display="Unlikeliness reward",
    summary="Unlikeliness reward: rare correct samples up-weighted by their rank",
    description="Correct completions are rewarded more the less likely the policy found them (rank within the "
                "group), so training does not only sharpen the distribution on solutions it already prefers.",
    paper=arxiv_paper(
        "he2025unlikely", "Rewarding the Unlikely: Lifting GRPO Beyond Distribution Sharpening", "He et al., 2025",
        ["Andre He", "Daniel Fried", "Sean Welleck"], 2025, "2506.02355"),
    config_prefixes=("unlikely_",), metric_prefixes=("unlikely/",),
    coefficients={"unlikely_beta": 1}, published={"unlikely_beta": 0.25},
    where="Sec. 3",
    changes=("a correct completion's reward × `1 − β·rank/G`, rank 0 for the group's least likely completion under "
             "the rollout policy, then GRPO's normalisation"),
))
class Unlikely(AdvantageStrategy):
    """Advantage-side: the unlikeliness reward, ranked by the rollout policy's log-probabilities."""

    config_class = UnlikelyConfig

    def needs_rollout_logps(self) -> bool:
        return True

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        ctx, a = self.ctx, self.args
        logps, mask = batch.gather_padded(batch.completion_logps), batch.gather_padded(batch.completion_mask)
        rewards = batch.rewards.to(logps.device)
        correct = is_correct(rewards, a.correct_reward_threshold)
        if a.unlikely_rank_among == "correct":
            ctx.guard_correctness(rewards, correct, batch.num_generations, "unlikely",
                              "the unlikeliness rank among correct completions ranks all of them or none")
        shaped = core_pk.unlikeliness_rewards(rewards, logps, mask, batch.num_generations, a.unlikely_beta,
                                              correct=correct, logp=a.unlikely_logp, rank_among=a.unlikely_rank_among)
        adv = group_advantages(shaped, batch.num_generations, scale=a.scale_rewards)
        adv = adv.to(batch.advantages.device)[batch.process_slice]
        factor = (shaped / rewards)[batch.process_slice].to(adv.device)
        local_correct = correct[batch.process_slice].to(adv.device) & (rewards[batch.process_slice] != 0).to(adv.device)
        ctx.queue_metrics({  # on the device until the next log: no host read on the step
            "unlikely/factor_correct_mean": (masked_sum(factor, local_correct), local_correct.sum()),
            "unlikely/adv_change_abs_mean": ((adv - batch.advantages).abs().sum(), adv.numel()),
        })
        return adv


class UnlikelyTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with the unlikeliness reward (the `Unlikely` strategy)."""

    method = "unlikely"

"""ProGRPO / ARM (seed "Back to Basics ... Generative Probabilities", Eq. 4, Sec. 3.2, Algorithm 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...core import advantages as core_adv
from ...methods import MethodInfo, arxiv_paper, register_method
from ...rewards.base import is_correct
from ..base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch, check_choice, check_non_negative
from ..strategy import AdvantageStrategy

PROGRPO_BASELINES = ("prompt", "group_mean")
PROGRPO_PROMPT_TOKENS = ("all", "user")


#: What ProGRPO does when its threshold judges every completion alike, by `progrpo_skip_groups` (for the warning).
SKIP_RULE_EFFECT = {
    "all_equal": "ProGRPO's skip rule leaves every group as GRPO's",
    "all_wrong": "ProGRPO's skip rule (progrpo_skip_groups=all_wrong) shifts every group when all are judged correct "
                 "and none when all are judged wrong, instead of the mixed groups",
}


@dataclass
class ProGRPOConfig(ExplorationGRPOConfig):
    """ProGRPO: `A~ = A + alpha * (c_ref - c_o)` in mixed groups, with confidences over the 20% lowest-probability
    tokens. Paper setup: alpha 0.3, clip [0.8, 1.28] (`epsilon=0.2`, `epsilon_high=0.28`), token-level loss (`dapo`)."""

    progrpo_alpha: float = field(default=0.3, metadata={"help": "Confidence-reweighting strength alpha (Eq. 4)."})
    progrpo_low_prob_fraction: float = field(
        default=0.2, metadata={"help": "Fraction of lowest-probability tokens the confidence averages (Sec. 3.2)."}
    )
    progrpo_baseline: str = field(
        default="prompt", metadata={"help": "Reference confidence: 'prompt' (Eq. 4) or 'group_mean' (Eq. 10)."}
    )
    progrpo_skip_groups: str = field(
        default="all_equal",
        metadata={"help": "Groups that keep GRPO's advantage: 'all_equal' (Algorithm 1: all-wrong and all-right "
                  "groups) or 'all_wrong' (Eq. 4 as printed: only groups with no correct completion). Both judge "
                  "correctness (reward > correct_reward_threshold), not equal rewards: set the threshold above any "
                  "partial credit (0.5 with a 0.1 format bonus)."},
    )
    progrpo_keep_sign: bool = field(
        default=False,
        metadata={"help": "Clamp shifted advantages so correct completions stay >= 0 and wrong ones <= 0 (not in the "
                  "paper; the shift alone can flip a sign, logged as progrpo/sign_flip_frac)."},
    )
    progrpo_prompt_tokens: str = field(
        default="all",
        metadata={"help": "Prompt tokens the prompt confidence uses: 'all' (the prompt as the model reads it, chat "
                  "template included, as the paper's verl-style setup tokenizes it) or 'user' (only the tokens of the "
                  "last user message)."},
    )
    epsilon_high: float | None = field(default=0.28, metadata={"help": "Upper clip: ratio <= 1 + epsilon_high."})

    def __post_init__(self):
        super().__post_init__()
        check_non_negative(self, {"progrpo_alpha": "the strength of the confidence reweighting (paper: 0.3; 0 "
                                                   "switches it off)"})
        check_choice(self, "progrpo_baseline", PROGRPO_BASELINES)
        if not 0.0 < self.progrpo_low_prob_fraction <= 1.0:
            raise ValueError(f"progrpo_low_prob_fraction must be in (0, 1], got {self.progrpo_low_prob_fraction}")
        check_choice(self, "progrpo_skip_groups", core_adv.PROGRPO_SKIP_GROUPS)
        check_choice(self, "progrpo_prompt_tokens", PROGRPO_PROMPT_TOKENS)


@register_method(MethodInfo(
    name="progrpo", side="advantage", display="ProGRPO (ARM)",
    summary="ProGRPO / ARM: confidence-reweighted advantages in mixed groups",
    description="Advantage re-weighting: in groups with both right and wrong completions, over-confident completions "
                "(high confidence over their lowest-probability tokens) get smaller advantages and under-explored ones "
                "larger.",
    paper=arxiv_paper(
        "li2026progrpo",
        "Back to Basics: Revisiting Exploration in Reinforcement Learning for LLM Reasoning via Generative "
        "Probabilities", "Li et al., 2026",
        ["Pengyi Li", "Elizaveta Goncharova", "Andrey Kuznetsov", "Ivan Oseledets"], 2026, "2602.05281"),
    config_prefixes=("progrpo_",), metric_prefixes=("progrpo/",),
    coefficients={"progrpo_alpha": 0}, published={"progrpo_alpha": 0.3},
    where="Eq. 4, Sec. 3.2, Alg. 1",
    changes="mixed-group advantages `A + α (c_ref − c_o)`, confidences over the 20% lowest-probability tokens",
))
class ProGRPO(AdvantageStrategy):
    """Advantage-side: reweights mixed-group advantages by prompt vs answer confidence (`core.progrpo_advantages`)."""

    config_class = ProGRPOConfig

    def needs_rollout_logps(self) -> bool:
        return True

    def needs_prompt_logps(self) -> bool:
        return self.args.progrpo_baseline == "prompt"

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        ctx, args = self.ctx, self.args
        logps, mask = batch.gather_padded(batch.completion_logps), batch.gather_padded(batch.completion_mask)
        prompt_logps = prompt_mask = None
        if args.progrpo_baseline == "prompt":
            prompt_logps = batch.gather_padded(batch.prompt_logps, pad_side="left")
            prompt_mask = batch.gather_padded(batch.prompt_logps_mask, pad_side="left")
        global_adv = batch.gather(advantages)

        def shifted(keep_sign: bool) -> torch.Tensor:
            return core_adv.progrpo_advantages(
                global_adv, batch.rewards, batch.num_generations, logps, mask, prompt_logps, prompt_mask,
                alpha=args.progrpo_alpha, low_prob_fraction=args.progrpo_low_prob_fraction,
                baseline=args.progrpo_baseline, skip_groups=args.progrpo_skip_groups, keep_sign=keep_sign,
                correct_threshold=args.correct_reward_threshold,
            )

        unclamped = shifted(keep_sign=False)
        new = shifted(keep_sign=True) if args.progrpo_keep_sign else unclamped
        # Sign flips the shift causes (before `progrpo_keep_sign` clamps them), over all completions.
        flips = ((global_adv > 0) & (unclamped < 0)) | ((global_adv < 0) & (unclamped > 0))
        conf = core_adv.confidence(logps, mask, args.progrpo_low_prob_fraction)
        correct = is_correct(batch.rewards, args.correct_reward_threshold).view(-1, batch.num_generations)
        # The one warning when no group mixes correct and wrong (the guard decides it at the log).
        ctx.guard_correctness(batch.rewards, correct, batch.num_generations, "progrpo",
                              SKIP_RULE_EFFECT[args.progrpo_skip_groups])
        mixed = correct.any(dim=1) & ~correct.all(dim=1)
        # Global already (the gathered batch): kept on the device until the next log, not reduced again. A confidence
        # is NaN for a completion without tokens; the means skip those (a step with none logs no value).
        metrics = {
            "progrpo/sign_flip_frac": (flips.sum(), flips.numel()),
            "progrpo/confidence_mean": (conf.nansum(), (~conf.isnan()).sum()),
            "progrpo/adjustment_abs_mean": ((new - global_adv).abs().sum(), new.numel()),
            "progrpo/mixed_group_frac": (mixed.sum(), mixed.numel()),
        }
        if prompt_logps is not None:
            ref = core_adv.confidence(prompt_logps, prompt_mask, args.progrpo_low_prob_fraction)
            metrics["progrpo/prompt_confidence_mean"] = (ref.nansum(), (~ref.isnan()).sum())
        ctx.queue_metrics(metrics, reduce=False)
        return new[batch.process_slice]

    def prompt_logps(self, logps: torch.Tensor, mask: torch.Tensor, output) -> tuple[torch.Tensor, torch.Tensor]:
        if self.args.progrpo_prompt_tokens != "user":
            return logps, mask
        user, fallbacks = self.ctx.user_prompt_mask(output)
        if fallbacks:
            self.ctx.warn_once(
                "progrpo_user_tokens",
                f"progrpo_prompt_tokens='user': for {fallbacks} of {len(user)} prompts the chat template could not "
                "be re-rendered to TRL's exact token ids, so those prompts use all their tokens. Set "
                "progrpo_prompt_tokens: all to silence this.",
            )
        return logps, mask * user.to(mask.dtype)


class ProGRPOTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with ProGRPO's advantages (the `ProGRPO` strategy)."""

    method = "progrpo"

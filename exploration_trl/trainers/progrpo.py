"""ProGRPO / ARM (seed "Back to Basics ... Generative Probabilities", Eq. 4, Sec. 3.2, Algorithm 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core import advantages as core_adv
from .base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch

PROGRPO_BASELINES = ("prompt", "group_mean")


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
    epsilon_high: float | None = field(default=0.28, metadata={"help": "Upper clip: ratio <= 1 + epsilon_high."})

    def __post_init__(self):
        super().__post_init__()
        if self.progrpo_baseline not in PROGRPO_BASELINES:
            raise ValueError(
                f"progrpo_baseline must be one of {', '.join(PROGRPO_BASELINES)}; got {self.progrpo_baseline!r}"
            )
        if not 0.0 < self.progrpo_low_prob_fraction <= 1.0:
            raise ValueError(f"progrpo_low_prob_fraction must be in (0, 1], got {self.progrpo_low_prob_fraction}")


class ProGRPOTrainer(ExplorationGRPOTrainer):
    """Advantage-side: reweights mixed-group advantages by prompt vs answer confidence (`core.progrpo_advantages`)."""

    config_class = ProGRPOConfig
    method_name = "progrpo"
    hook = ("advantage", "progrpo")

    def _needs_rollout_logps(self) -> bool:
        return True

    def _needs_prompt_logps(self) -> bool:
        return self.args.progrpo_baseline == "prompt" or super()._needs_prompt_logps()

    def _compute_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        advantages = super()._compute_advantages(batch)
        self._mark_hook_ran("progrpo")
        args = self.args
        logps, mask = batch.gather_padded(batch.completion_logps), batch.gather_padded(batch.completion_mask)
        prompt_logps = prompt_mask = None
        if args.progrpo_baseline == "prompt":
            prompt_logps = batch.gather_padded(batch.prompt_logps, pad_side="left")
            prompt_mask = batch.gather_padded(batch.prompt_logps_mask, pad_side="left")
        global_adv = batch.gather(advantages)
        new = core_adv.progrpo_advantages(
            global_adv, batch.rewards, batch.num_generations, logps, mask, prompt_logps, prompt_mask,
            alpha=args.progrpo_alpha, low_prob_fraction=args.progrpo_low_prob_fraction,
            baseline=args.progrpo_baseline,
        )
        mode = "train" if self.model.training else "eval"
        conf = core_adv.confidence(logps, mask, args.progrpo_low_prob_fraction)
        self._metrics[mode]["progrpo/confidence_mean"].append(torch.nanmean(conf).item())
        if prompt_logps is not None:
            ref = core_adv.confidence(prompt_logps, prompt_mask, args.progrpo_low_prob_fraction)
            self._metrics[mode]["progrpo/prompt_confidence_mean"].append(torch.nanmean(ref).item())
        self._metrics[mode]["progrpo/adjustment_abs_mean"].append((new - global_adv).abs().mean().item())
        return new[batch.process_slice]

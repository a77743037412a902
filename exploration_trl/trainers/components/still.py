"""STILL report shapers (Chen et al. 2025, "An Empirical Study on Eliciting and Improving R1-like Reasoning Models"):
perplexity shaping (Eq. 11), then the position bonus (Eq. 12), applied after any advantage-side method. Any method's
config switches them on (`ppl_shaping_alpha`, `position_bonus_gamma`); they are registered shapings, cited on cards."""

from __future__ import annotations

import torch

from ...core import advantages as core_adv
from .rollout import RolloutBatch


def position_bonus_active(args, step: int) -> bool:
    start, length = args.position_bonus_start_step, args.position_bonus_num_steps
    return step >= start and (length is None or step < start + length)


def apply_still_shapers(args, advantages: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    """This process's advantages after the shapers that are on (a shaper at 0 returns them unchanged)."""
    if args.ppl_shaping_alpha != 0.0:
        logps = batch.gather_padded(batch.completion_logps)
        mask = batch.gather_padded(batch.completion_mask)
        per_token = advantages.dim() == 2  # e.g. DS-GRPO's token granularity: scale every token of a row
        global_adv = batch.gather_padded(advantages) if per_token else batch.gather(advantages)
        shaped = core_adv.ppl_shaped_advantages(
            global_adv, logps, mask, batch.num_generations, alpha=args.ppl_shaping_alpha
        )
        advantages = shaped[batch.process_slice]
        if per_token:
            advantages = advantages[:, : batch.completion_mask.size(1)]
    if args.position_bonus_gamma != 0.0 and position_bonus_active(args, batch.global_step):
        advantages = core_adv.position_bonus_advantages(
            advantages, batch.completion_mask, gamma=args.position_bonus_gamma,
            direction=args.position_bonus_direction, scale=args.position_bonus_scale,
            center=args.position_bonus_center,
        )
    return advantages

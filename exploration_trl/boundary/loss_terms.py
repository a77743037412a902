"""A per-token loss term reduced exactly as TRL 1.16's `_compute_loss` reduces its policy loss (`loss_type`), so that
a loss-side method's extra term (KL-Cov's penalty) is weighted like TRL's own. `tests/test_trl_contract.py` checks it
against TRL's loss for every loss type."""

from __future__ import annotations

import torch


def loss_mask(inputs) -> torch.Tensor:
    """The tokens TRL's loss counts: the completion, less tool output when there is some."""
    mask = inputs["completion_mask"]
    return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]


def aggregate_per_token(trainer, per_token: torch.Tensor, mask: torch.Tensor, inputs) -> torch.Tensor:
    """`per_token` `(B, T)` reduced as `trainer.loss_type` reduces TRL's policy loss on this micro-batch."""
    mode = "train" if trainer.model.training else "eval"
    accum = trainer.current_gradient_accumulation_steps if mode == "train" else 1.0
    mask = mask.to(per_token.dtype)
    lt = trainer.loss_type
    if lt in ("grpo", "sapo"):
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accum
    if lt == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0) / accum
    if lt == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * trainer.max_completion_length) / accum
    if lt in ("cispo", "dapo", "vespo"):
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes
        if mode == "train":
            normalizer = normalizer * trainer.current_gradient_accumulation_steps / trainer.args.steps_per_generation
        return (per_token * mask).sum() / normalizer
    if lt == "luspo":
        return (per_token * mask).sum(-1).mean() / accum
    raise ValueError(f"Unknown loss type: {lt}")


def weighted_as_trl(trainer, extra: torch.Tensor, inputs) -> torch.Tensor:
    """A loss-side method's extra term weighted by vLLM's importance-sampling ratio as TRL weights its policy term (and
    as verl's kl_cov weights its whole per-token loss), so that it stays an expectation under pi_old."""
    if "importance_sampling_ratio" in inputs and trainer.loss_type != "vespo":
        return extra * inputs["importance_sampling_ratio"]
    return extra

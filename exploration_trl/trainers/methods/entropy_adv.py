"""Entropy-based advantage shaping (Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective",
Eq. 4-6, Sec. 3.2)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...core import bonuses as core_bonus
from ...core.utils import as_valid, broadcast_advantages, masked_sum
from ...methods import MethodInfo, arxiv_paper, register_method
from ..base import ExplorationGRPOConfig, ExplorationGRPOTrainer, check_non_negative
from ...boundary.capture import Capture
from ..components.window_warning import WindowWarning
from ..strategy import LossStrategy

#: Per micro-batch, 1 when the term added nothing to any token (every advantage 0, or alpha 0).
NO_TERM = "entropy_adv/no_term_frac"


@dataclass
class EntropyAdvConfig(ExplorationGRPOConfig):
    """Entropy-based advantage: every completion token's advantage becomes `A + min(alpha * H.detach(), |A| / kappa)`,
    `H` the current policy's entropy at that token, read from the forward pass TRL's loss already makes. The
    paper's GRPO runs: alpha 0.4, kappa 2, clip 0.2 / 0.28, token-level loss."""

    entropy_adv_alpha: float = field(
        default=0.4, metadata={"help": "Weight alpha of the detached token entropy (paper: 0.4 with GRPO, 0.1 with "
                                       "PPO; 0 is GRPO)."})
    entropy_adv_kappa: float = field(
        default=2.0, metadata={"help": "The term is at most |A| / kappa, so it never flips an advantage's sign "
                                       "(paper: 2; must be > 1)."})
    epsilon_high: float | None = field(default=0.28, metadata={"help": "Upper clip: ratio <= 1 + epsilon_high "
                                                                       "(the paper's clip-higher, Table 4)."})

    def __post_init__(self):
        super().__post_init__()
        check_non_negative(self, {"entropy_adv_alpha": "the weight of the token entropy in the advantage (paper: 0.4; "
                                                       "0 switches it off)"})
        if not self.entropy_adv_kappa > 1.0:
            raise ValueError(f"entropy_adv_kappa is {self.entropy_adv_kappa} but must be > 1, or the entropy term "
                             "could flip an advantage's sign (paper: 2)")


def _no_term(ctx, values: list[float]) -> str:
    share = sum(v > 0 for v in values) / len(values)
    return (f"entropy_adv: on {share:.0%} of the micro-batches since the last log the entropy term added nothing to "
            "any token (every advantage was 0, as in groups whose rewards are all equal"
            + (", or entropy_adv_alpha is 0" if ctx.args.entropy_adv_alpha == 0 else "")
            + f"); logged as {NO_TERM}. Warned once.")


@register_method(MethodInfo(
    name="entropy_adv", side="loss", display="Entropy-based advantage",
    summary="Entropy advantage: a clipped, detached token-entropy term added to each token's advantage",
    description="A clipped, gradient-free term proportional to each token's entropy is added to its advantage, so "
                "that high-entropy (exploratory) tokens of correct completions are reinforced more and those of wrong "
                "completions penalised less.",
    paper=arxiv_paper(
        "cheng2025entropy", "Reasoning with Exploration: An Entropy Perspective", "Cheng et al., 2025",
        ["Daixuan Cheng", "Shaohan Huang", "Xuekai Zhu", "Bo Dai", "Wayne Xin Zhao", "Zhenliang Zhang", "Furu Wei"],
        2025, "2506.14758", "cs.CL"),
    config_prefixes=("entropy_adv_",), metric_prefixes=("entropy_adv/",),
    coefficients={"entropy_adv_alpha": 1}, published={"entropy_adv_alpha": 0.4, "entropy_adv_kappa": 2.0},
    where="Eq. 4–6, Sec. 3.2",
    changes=("every token's advantage `A + min(α·H_t, |A|/κ)`, `H_t` the current policy's token entropy from the "
             "loss's own forward pass, detached; never flips a sign"),
))
class EntropyAdv(LossStrategy):
    """Loss-side: replaces the micro-batch's advantages by the per-token shaped ones (`core.entropy_shaped_advantages`)
    between TRL's forward pass and its loss, with the entropies that pass computed (no second pass, no
    `(B, T, vocab)` tensor of our own)."""

    config_class = EntropyAdvConfig
    window_warnings = (WindowWarning(NO_TERM, _no_term),)

    def transform_logps(self, logps, capture: Capture, inputs, state):
        ctx, a = self.ctx, self.args
        mask = ctx.loss_mask(inputs)
        advantages = inputs["advantages"]
        shaped = core_bonus.entropy_shaped_advantages(advantages, capture.entropies, mask, a.entropy_adv_alpha,
                                                      a.entropy_adv_kappa)
        # TRL 1.16's `_compute_loss` reads `inputs["advantages"]` after this forward pass (pinned in
        # tests/test_trl_contract.py): the shaped ones are handed to it for this call and the rollout's put back
        # after the loss (`ExplorationGRPOTrainer.compute_loss`), so a rollout that feeds several updates is shaped
        # afresh each time, with the entropies of that update's policy.
        state["advantages_before_shaping"] = advantages
        inputs["advantages"] = shaped
        valid = as_valid(mask)
        base = broadcast_advantages(advantages, shaped.shape)
        psi = shaped - base
        moved = valid & (base != 0)
        capped = moved & (a.entropy_adv_alpha * capture.entropies.detach().float() >= base.abs() / a.entropy_adv_kappa)
        n_valid = valid.sum(dtype=torch.float32)
        ctx.queue_metrics({  # device scalars, read at the next log
            "entropy_adv/term_mean": (masked_sum(psi, valid), n_valid),
            "entropy_adv/term_ratio_mean": (masked_sum(psi / base.abs().clamp(min=1e-12), moved),
                                            moved.sum(dtype=torch.float32)),
            "entropy_adv/capped_frac": (capped.sum(dtype=torch.float32), n_valid),
            NO_TERM: ((masked_sum(psi, valid) == 0).float(), 1.0),
        })
        return logps


class EntropyAdvTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with the entropy-based advantage (the `EntropyAdv` strategy)."""

    method = "entropy_adv"

"""Pure-torch core math of exploration-trl (advantages and per-token loss terms).

Nothing here imports TRL or transformers, so these functions can be used from any RL framework.
The contract (the conventions, each function's formula with its paper and equation, the edge cases):
docs/math.md, "Conventions" and one section per method.
"""

from .utils import masked_mean
from .advantages import (
    confidence,
    dsgrpo_advantages,
    group_advantages,
    position_bonus_advantages,
    ppl_shaped_advantages,
    progrpo_advantages,
)
from .losses import (
    casp_ratio,
    clip_cov_per_token_loss,
    clip_cov_select,
    forking_mask,
    kl_cov_per_token_loss,
    kl_cov_select,
    token_covariance,
)
from .passk import passk_advantages, pkpo_advantages, pkpo_transform, unlikeliness_rewards
from .estimators import maxrl_advantages, quantile_advantages, weighted_reinforce_advantages
from .bonuses import entropy_shaped_advantages, outcome_batch_penalty, outcome_ucb_bonus

__all__ = [
    "group_advantages",
    "confidence",
    "progrpo_advantages",
    "dsgrpo_advantages",
    "ppl_shaped_advantages",
    "position_bonus_advantages",
    "passk_advantages",
    "pkpo_transform",
    "pkpo_advantages",
    "unlikeliness_rewards",
    "maxrl_advantages",
    "weighted_reinforce_advantages",
    "quantile_advantages",
    "entropy_shaped_advantages",
    "outcome_ucb_bonus",
    "outcome_batch_penalty",
    "forking_mask",
    "casp_ratio",
    "token_covariance",
    "kl_cov_select",
    "kl_cov_per_token_loss",
    "clip_cov_select",
    "clip_cov_per_token_loss",
    "masked_mean",
]

"""Exploration bonuses added to GRPO's advantages (pure torch, no TRL import): the entropy-based advantage term of
Cheng et al. 2025 and the outcome-based exploration bonuses of Song, Kempe and Munos 2025.

Conventions as in `advantages.py` (docs/math.md): `B = num_prompts * G` rows, groups contiguous; `(B, T)` tensors
right-padded with `mask` 1 on real tokens; float32 results; nothing reads the device on the host.
"""

from __future__ import annotations

import torch

from .utils import as_valid, broadcast_advantages, check_groups, flat_rows, to_f32

__all__ = [
    "entropy_shaped_advantages",
    "outcome_ucb_bonus",
    "OUTCOME_UCB_BASELINES",
    "outcome_batch_penalty",
]

#: `outcome_ucb_bonus` baselines: none (the paper's "UCB"), a constant `b0` ("UCB-Con") or a mean bonus ("UCB-Mean")
#: over the completion's group ("mean"), the whole batch ("mean_batch") or the group's other completions
#: ("mean_loo", leave-one-out). Which mean UCB-Mean takes is not pinned down by the paper: the group's is our choice.
OUTCOME_UCB_BASELINES = ("none", "constant", "mean", "mean_batch", "mean_loo")


def entropy_shaped_advantages(advantages: torch.Tensor, entropies: torch.Tensor, mask: torch.Tensor,
                              alpha: float = 0.4, kappa: float = 2.0) -> torch.Tensor:
    """Entropy-based advantage shaping (Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective",
    arXiv 2506.14758, Eq. 5 and Eq. 6): `A_t + psi(H_t)` with `psi(H_t) = min(alpha * H_t.detach(), |A_t| / kappa)`,
    float32 `(B, T)`.

    `H_t` is the current policy's entropy at each completion token (Eq. 4), detached: the term changes how much a
    token is pushed, not a gradient of the entropy. `psi >= 0` is added to positive and negative advantages alike;
    the cap `|A_t| / kappa` (kappa > 1) keeps the sign, so a token with `A = 0` stays at 0. The paper's GRPO runs use
    alpha = 0.4 and kappa = 2. Padding positions keep `A`.
    """
    if kappa <= 1.0:
        raise ValueError(f"kappa is {kappa}; it must be > 1, or the term could flip an advantage's sign (paper: 2)")
    h = to_f32(entropies).detach()
    a = broadcast_advantages(advantages, h.shape)
    psi = torch.minimum(alpha * h, a.abs() / kappa)
    return torch.where(as_valid(mask), a + psi, a)


def outcome_ucb_bonus(counts: torch.Tensor, has_answer: torch.Tensor, num_generations: int,
                      baseline: str = "constant", b0: float = 0.5) -> torch.Tensor:
    """Historical outcome exploration (Song, Kempe and Munos 2025, "Outcome-based Exploration for LLM Reasoning",
    arXiv 2509.06941, Sec. 3.1; no numbered equation is pinned): `b = min(1, 1 / sqrt(N(x, a)))`, float32 `(B,)`, where
    `counts` holds N(x, a), how often the completion's final answer `a` was sampled for its prompt `x` before this batch
    (0 for a new answer: bonus 1).

    `baseline`: "none" (UCB) adds `b`; "constant" (UCB-Con, the paper's best historical variant) adds `b - b0`, so
    answers seen more than `1 / b0^2` times are pushed down; "mean" (UCB-Mean) subtracts the mean bonus of the
    completion's group (over its rows with an answer). The paper leaves open which mean; two other readings are
    options: "mean_batch" subtracts the mean over every answered row of the batch, "mean_loo" the mean over the
    other answered rows of the completion's group (leave-one-out; a group's only answered row gets 0, as with
    "mean"). Rows without an answer (`has_answer` False) get 0 and take no part in any mean.
    """
    if baseline not in OUTCOME_UCB_BASELINES:
        raise ValueError(f"baseline is {baseline!r}; choose one of {', '.join(OUTCOME_UCB_BASELINES)}")
    n = to_f32(flat_rows(counts, "counts"))
    has = flat_rows(has_answer, "has_answer").bool().to(n.device)
    b = torch.where(n > 0, n.clamp(min=1.0).rsqrt(), torch.ones_like(n)).clamp(max=1.0)
    if baseline == "constant":
        b = b - b0
    elif baseline == "mean_batch":
        answered_b = torch.where(has, b, torch.zeros_like(b))
        b = answered_b - answered_b.sum() / has.float().sum().clamp(min=1.0)
    elif baseline in ("mean", "mean_loo"):
        n_groups = check_groups(n.shape[0], num_generations)
        grouped = torch.where(has, b, torch.zeros_like(b)).view(n_groups, num_generations)
        answered = has.view(n_groups, num_generations).float().sum(dim=1, keepdim=True)
        if baseline == "mean":
            mean = grouped.sum(dim=1, keepdim=True) / answered.clamp(min=1.0)
        else:  # the other answered rows of the group; none: the row's own bonus, so it gets 0
            others = (grouped.sum(dim=1, keepdim=True) - grouped) / (answered - 1.0).clamp(min=1.0)
            mean = torch.where(answered > 1.0, others, grouped)
        b = (grouped - mean).reshape(-1)
    return torch.where(has, b, torch.zeros_like(b))


def outcome_batch_penalty(answer_ids: torch.Tensor, has_answer: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Batch outcome exploration (Song, Kempe and Munos 2025, arXiv 2509.06941, Sec. 3.2; no numbered equation is
    pinned): `-(1/G) * sum_{j != i} 1{a_i = a_j}` over the completion's group, float32 `(B,)`: each completion is
    penalised by the share of its group that gave the same final answer. `answer_ids` `(B,)` are integer keys of the
    final answers (equal answers, equal keys); rows without an answer neither get nor cause a penalty.
    """
    ids = flat_rows(answer_ids, "answer_ids")
    has = flat_rows(has_answer, "has_answer").bool().to(ids.device)
    n_groups = check_groups(ids.shape[0], num_generations)
    g_ids, g_has = ids.view(n_groups, num_generations), has.view(n_groups, num_generations)
    same = (g_ids[:, :, None] == g_ids[:, None, :]) & g_has[:, :, None] & g_has[:, None, :]
    others = same.sum(dim=2).float() - g_has.float()  # j != i: remove the completion's match with itself
    return (-others / num_generations).reshape(-1)

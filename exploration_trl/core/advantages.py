"""Advantage estimators and advantage shaping (pure torch, no TRL import).

Conventions (docs/math.md, "Conventions"): a batch holds ``B = num_prompts * G`` completions, the ``G``
completions of a prompt being contiguous rows; ``(B, T)`` completion tensors are right-padded and
``mask`` is 1 on real tokens. All statistics are computed in float32; inputs are never modified.

Shapes of the sequence-level shaping functions (``progrpo_advantages``, ``ppl_shaped_advantages`` and
``dsgrpo_advantages`` at a sequence granularity, its default): ``advantages`` of shape ``(B,)`` or ``(B, 1)`` give
a ``(B,)`` result; per-token ``(B, T)`` advantages give a ``(B, T)`` result where the per-row change is
applied to every column of the row. ``dsgrpo_advantages`` at ``granularity="token"`` and
``position_bonus_advantages`` always return ``(B, T)``.
"""

from __future__ import annotations

import torch

from .utils import (
    as_valid,
    broadcast_advantages,
    check_groups,
    flat_rows,
    masked_sum,
    nanstd,
    row_length_mean,
    split_sequence_advantages,
    to_f32,
)

__all__ = [
    "check_position_bonus_shape",
    "group_advantages",
    "confidence",
    "progrpo_advantages",
    "PROGRPO_SKIP_GROUPS",
    "dsgrpo_advantages",
    "DSGRPO_GRANULARITIES",
    "ppl_shaped_advantages",
    "position_bonus_advantages",
]

# Tolerance used when taking ceil(fraction * n): 0.28 * 25 is 7.000000000000001 in floating point,
# and the intended "28% of 25 tokens" is 7, not 8.
_CEIL_TOL = 1e-9


def group_advantages(
    rewards: torch.Tensor, num_generations: int, scale: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """GRPO group-relative advantage ``A = (r - mean_group(r)) / (std_group(r) + eps)``, float32 ``(B,)``.

    GRPO (DeepSeekMath, arXiv 2402.03300, Sec. 4.1.2, outcome supervision): each completion is scored against the
    other completions of its prompt, so no value network is needed. ``scale="batch"`` divides by the std of
    the whole batch (less noisy for small groups), ``scale="none"`` only centres (Dr. GRPO: removes the
    difficulty bias of per-group std). Mirrors TRL 1.16's ``GRPOTrainer`` (``sum_then_normalize``):
    NaN rewards (unscorable completions) are ignored by the mean/std and get advantage 0; a group or
    batch of one completion gets std 0.
    """
    r = to_f32(flat_rows(rewards, "rewards"))
    n_groups = check_groups(r.shape[0], num_generations)
    grouped = r.view(n_groups, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale in ("group", "none"):
        if num_generations > 1:
            std = nanstd(grouped, dim=1).repeat_interleave(num_generations)
        else:
            std = torch.zeros_like(r)
    elif scale == "batch":
        std = nanstd(r).expand_as(r) if r.numel() > 1 else torch.zeros_like(r)
    else:
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    adv = r - mean
    if scale != "none":
        adv = adv / (std + eps)
    return torch.nan_to_num(adv, nan=0.0)


def confidence(logps: torch.Tensor, mask: torch.Tensor, low_prob_fraction: float = 0.2) -> torch.Tensor:
    """Low-probability-token confidence of each row, float32 ``(B,)``.

    ProGRPO Eq. 5/6 with Sec. 3.2 ("low-probability token length normalisation") and Eq. 12: the
    geometric mean of the ``k = max(1, ceil(low_prob_fraction * n_valid))`` lowest token
    probabilities, ``exp(mean of the k lowest valid logps)``. Averaging only the bottom tokens keeps
    the score sensitive to the few uncertain "decision" tokens instead of being dominated by the many
    near-certain ones. A row with no valid token returns NaN.
    """
    if not 0.0 <= low_prob_fraction <= 1.0:
        raise ValueError(f"low_prob_fraction must be in [0, 1], got {low_prob_fraction}")
    lp = to_f32(logps)
    valid = as_valid(mask)
    if lp.dim() != 2 or valid.shape != lp.shape:
        raise ValueError(f"logps and mask must both be (B, T); got {tuple(logps.shape)} and {tuple(mask.shape)}")
    n = valid.sum(dim=-1)
    k = torch.ceil(n.to(torch.float64) * low_prob_fraction - _CEIL_TOL).to(torch.long)
    k = torch.minimum(k.clamp(min=1), n.clamp(min=1))
    inf = torch.full((), float("inf"), dtype=lp.dtype, device=lp.device)
    sorted_lp, _ = torch.where(valid, lp, inf).sort(dim=-1)
    ranks = torch.arange(lp.shape[-1], device=lp.device).unsqueeze(0)
    take = (ranks < k.unsqueeze(-1)) & (ranks < n.unsqueeze(-1))
    low_sum = torch.where(take, sorted_lp, torch.zeros_like(sorted_lp)).sum(dim=-1)
    conf = torch.exp(low_sum / k.to(torch.float32))
    return torch.where(n > 0, conf, torch.full_like(conf, float("nan")))


PROGRPO_SKIP_GROUPS = ("all_equal", "all_wrong")


def _uniform_correctness_groups(rewards: torch.Tensor, num_generations: int, correct_threshold: float) -> torch.Tensor:
    """Per-row bool: the row's group is all correct or all wrong (``reward > correct_threshold``), NaN rewards ignored
    (an all-NaN group counts). Correctness, not equal rewards: a graded reward (accuracy + 0.1 format) varies inside
    an all-wrong group."""
    n_groups = check_groups(rewards.shape[0], num_generations)
    g = rewards.view(n_groups, num_generations)
    scored = ~torch.isnan(g)
    correct = (g > correct_threshold) & scored
    n_correct, n_scored = correct.sum(dim=1), scored.sum(dim=1)
    uniform = (n_correct == 0) | (n_correct == n_scored)
    return uniform.repeat_interleave(num_generations)


def _all_wrong_groups(rewards: torch.Tensor, num_generations: int, correct_threshold: float) -> torch.Tensor:
    """Per-row bool: no (non-NaN) reward of the row's group exceeds `correct_threshold` (an all-NaN group counts)."""
    n_groups = check_groups(rewards.shape[0], num_generations)
    correct = (rewards > correct_threshold).view(n_groups, num_generations)  # NaN > x is False
    return (~correct.any(dim=1)).repeat_interleave(num_generations)


def progrpo_advantages(
    advantages: torch.Tensor,
    rewards: torch.Tensor,
    num_generations: int,
    completion_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    prompt_logps: torch.Tensor | None,
    prompt_mask: torch.Tensor | None,
    alpha: float = 0.3,
    low_prob_fraction: float = 0.2,
    baseline: str = "prompt",
    skip_groups: str = "all_equal",
    keep_sign: bool = False,
    correct_threshold: float = 0.0,
) -> torch.Tensor:
    """ProGRPO / ARM advantage reweighting ``A~ = A + alpha * (c_ref - c_o)`` (arXiv 2602.05281, Eq. 4, Algorithm 1).

    Seed "Back to Basics ... Generative Probabilities": over-confident completions (``c_o`` above the
    reference confidence) are pushed down and under-confident ones up, which counters the sharpening
    of GRPO and keeps low-probability correct paths alive. ``c_o = confidence(completion)``;
    ``baseline="prompt"`` uses ``c_ref = confidence(prompt)``, the model's confidence on its own
    prompt; ``baseline="group_mean"`` uses the group mean of ``c_o`` (Eq. 10, NaNs skipped).
    Which groups keep ``A`` is ``skip_groups``: ``"all_equal"`` (default, Algorithm 1 line 14: all-wrong and
    all-right groups) or ``"all_wrong"`` (Eq. 4 as printed: only all-wrong groups; an all-right group then gets
    ``alpha * (c_ref - c_o)`` added to its GRPO advantage). Both judge a group by correctness, ``reward >
    correct_threshold`` (``rewards.is_correct``), not by equal total rewards: under a graded reward (accuracy + a
    0.1 format bonus, threshold 0.5) an all-wrong group with rewards ``[0.1, 0, 0.1, 0]`` has nonzero GRPO advantages,
    and the paper leaves it untouched all the same.
    Rows whose ``c_o`` or ``c_ref`` is NaN and rows whose reward is NaN (unscorable; TRL gives them no learning
    signal) keep ``A`` too.

    The shift can flip an advantage's sign (G = 16 with 15 correct gives A = 0.25 < alpha = 0.3).
    ``keep_sign=True`` (not in the paper, off by default) clamps correct rows (``reward > correct_threshold``)
    at ``>= 0`` and the other rows at ``<= 0`` after the shift.

    Returns float32 ``(B,)`` for ``(B,)``/``(B, 1)`` advantages and ``(B, T)`` for ``(B, T)`` ones.
    """
    if skip_groups not in PROGRPO_SKIP_GROUPS:
        raise ValueError(f"skip_groups must be one of {', '.join(PROGRPO_SKIP_GROUPS)}; got {skip_groups!r}")
    r = to_f32(flat_rows(rewards, "rewards"))
    B = r.shape[0]
    a, restore = split_sequence_advantages(advantages, B)
    c_o = confidence(completion_logps, completion_mask, low_prob_fraction)
    if baseline == "prompt":
        if prompt_logps is None or prompt_mask is None:
            raise ValueError("baseline='prompt' needs prompt_logps and prompt_mask")
        c_ref = confidence(prompt_logps, prompt_mask, low_prob_fraction)
    elif baseline == "group_mean":
        n_groups = check_groups(B, num_generations)
        c_ref = torch.nanmean(c_o.view(n_groups, num_generations), dim=1).repeat_interleave(num_generations)
    else:
        raise ValueError(f"baseline must be 'prompt' or 'group_mean', got {baseline!r}")
    skipped = (
        _uniform_correctness_groups(r, num_generations, correct_threshold) if skip_groups == "all_equal"
        else _all_wrong_groups(r, num_generations, correct_threshold)
    )
    keep = skipped | torch.isnan(c_o) | torch.isnan(c_ref) | torch.isnan(r)
    shift = torch.where(keep, torch.zeros_like(c_o), alpha * (c_ref - c_o)).unsqueeze(-1)
    out = torch.where(keep.unsqueeze(-1), a, a + shift)
    if keep_sign:
        correct = (r > correct_threshold).unsqueeze(-1)
        clamped = torch.where(correct, out.clamp(min=0.0), out.clamp(max=0.0))
        out = torch.where(keep.unsqueeze(-1), out, clamped)
    return restore(out)


DSGRPO_GRANULARITIES = ("token", "sequence_mean", "sequence_sum")


def dsgrpo_advantages(
    advantages: torch.Tensor,
    rewards: torch.Tensor,
    completion_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    gamma_p: float = 0.01,
    gamma_n: float = 0.01,
    correct_threshold: float = 0.0,
    granularity: str = "sequence_sum",
) -> torch.Tensor:
    """DS-GRPO differential smoothing (arXiv 2511.19942, Sec. 3.5 / 4.2, rollout-policy form of App. B.3; the change is
    stated in prose, no numbered equation is pinned).

    Seed "Differential Smoothing Mitigates Sharpening": correct completions (``reward > correct_threshold``)
    get ``A - gamma_p * L`` (an entropy bonus: low-probability correct answers are reinforced more, fighting
    diversity collapse) and incorrect ones ``A + gamma_n * L`` (an entropy penalty that sharpens away from
    errors), in every group, all-right and all-wrong ones included. Rows with a NaN reward keep ``A``.

    The paper states the change per trajectory ("a term proportional to their log-probability"), and App. B.3's
    entropy equivalence is at trajectory level; no code of its authors is public. ``granularity`` picks ``L``:

    * ``"sequence_sum"`` (default, the literal form): ``L = sum(logps * mask) = log pi_old(y|x)``, one value per
      row, the same shift for every token of the trajectory.
    * ``"token"``: ``L = logps[:, t]``, a per-token ``(B, T)`` result with 0 on padding. A per-state entropy bonus:
      it drops the cross-token terms of the trajectory form, so its expected gradient differs from the paper's
      (an approximation, not an estimate of it); at ``gamma = 0.01`` its scale is an ordinary entropy coefficient's.
    * ``"sequence_mean"``: ``L = sum(logps * mask) / max(n_valid, 1)``, one value per row (0.1.x behaviour;
      with ``gamma = 0.01`` it moves advantages by ~0.003 on a long response).

    Sequence granularities return float32 ``(B,)`` for ``(B,)``/``(B, 1)`` advantages and ``(B, T)`` for
    ``(B, T)`` ones (the row's change applied to every column).
    """
    if granularity not in DSGRPO_GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(DSGRPO_GRANULARITIES)}; got {granularity!r}")
    r = to_f32(flat_rows(rewards, "rewards"))
    correct = r > correct_threshold
    unscored = torch.isnan(r)
    if granularity == "token":
        valid = as_valid(completion_mask)
        a = broadcast_advantages(advantages, valid.shape)
        lp = torch.where(valid, to_f32(completion_logps), torch.zeros((), device=valid.device))
        shift = torch.where(correct.unsqueeze(-1), -gamma_p * lp, gamma_n * lp)
        shift = torch.where(unscored.unsqueeze(-1), torch.zeros_like(shift), shift)
        return torch.where(valid, a + shift, torch.zeros_like(a))
    a, restore = split_sequence_advantages(advantages, r.shape[0])
    if granularity == "sequence_mean":
        L = row_length_mean(completion_logps, completion_mask)
    else:
        L = masked_sum(completion_logps, completion_mask, dim=-1)
    shift = torch.where(correct, -gamma_p * L, gamma_n * L)
    shift = torch.where(unscored, torch.zeros_like(shift), shift)
    return restore(a + shift.unsqueeze(-1))


def ppl_shaped_advantages(
    advantages: torch.Tensor,
    completion_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    num_generations: int,
    alpha: float = 0.01,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Perplexity-shaped advantages ``A~ = A * (1 - alpha * w)`` (STILL report, arXiv 2508.07534, Eq. 7 and Eq. 11).

    "From Trial-and-Error to Improvement": ``lnPPL = -lbar`` (``lbar`` the length-averaged logp,
    0 for an empty row) and ``w = (lnPPL - mean_group) / (std_group + eps)`` (unbiased std). Among
    completions of a prompt, lower-perplexity (more confident) ones get a larger magnitude and
    high-perplexity ones a smaller one, which favours efficient, confident reasoning. With one
    completion per group ``w`` is 0.

    Returns float32 ``(B,)`` for ``(B,)``/``(B, 1)`` advantages and ``(B, T)`` for ``(B, T)`` ones.
    """
    lnppl = -row_length_mean(completion_logps, completion_mask)
    B = lnppl.shape[0]
    a, restore = split_sequence_advantages(advantages, B)
    n_groups = check_groups(B, num_generations)
    g = lnppl.view(n_groups, num_generations)
    if num_generations > 1:
        w = (g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True, correction=1) + eps)
        w = w.reshape(B)
    else:
        w = torch.zeros_like(lnppl)
    return restore(a * (1.0 - alpha * w).unsqueeze(-1))


def check_position_bonus_shape(direction: float, scale: float, center: float) -> None:
    """Refuse a position-bonus shape that Eq. 8 does not define (one check for the trainer's config and verl's)."""
    import math

    if direction not in (1.0, -1.0):
        raise ValueError(f"position_bonus_direction is {direction} but must be 1 (bonus rising towards the end of the "
                         "response) or -1 (falling): it is d in STILL's Eq. 8")
    if not (math.isfinite(scale) and math.isfinite(center)):
        raise ValueError(f"position_bonus_scale and position_bonus_center must be finite; got {scale} and {center} "
                         "(report: 15 and 0.5)")


def position_bonus_advantages(
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    gamma: float = 0.1,
    direction: float = 1.0,
    scale: float = 15.0,
    center: float = 0.5,
) -> torch.Tensor:
    """Per-token position bonus ``A~_t = A + sign(A) * gamma * sigmoid(direction*scale*(l_t - center))``.

    STILL report (arXiv 2508.07534) Eq. 8 and Eq. 12, ``b_t = gamma * sigmoid(d * m * (l_t - n))`` with
    ``d = direction``, ``m = scale``, ``n = center``: ``l_t = t / (n_valid - 1)`` is the relative position of a valid token
    (1.0 for a one-token completion), so with ``direction=1`` tokens late in the answer, where the conclusion is drawn,
    get up to ``gamma`` extra magnitude while early tokens get ~0 (``direction=-1`` reverses it). The bonus keeps the
    sign of ``A``; ``A == 0`` stays 0. Padding keeps ``A``. ``t`` counts valid tokens (the column index for right-padded
    rows).

    Re-centred: the report prints ``n = -0.5``. Read literally, ``sigmoid(15 * (l + 0.5))`` is >= sigmoid(7.5) =
    0.9994 for every ``l`` in [0, 1], a flat ~gamma bonus for ``d = 1`` and ~0 (<= 5.5e-4 * gamma) for ``d = -1``,
    which contradicts the report's own text (a bonus that rises, or falls, along the response). The default
    ``center=0.5`` puts the sigmoid's midpoint at the middle of the response, the reading that text describes;
    ``center=-0.5`` gives the literal form.

    Returns float32 ``(B, T)``.
    """
    valid = as_valid(completion_mask)
    a = broadcast_advantages(advantages, valid.shape)
    n = valid.sum(dim=-1, keepdim=True).to(torch.float32)
    t = valid.to(torch.float32).cumsum(dim=-1) - 1.0
    rel = torch.where(n > 1, t / (n - 1.0).clamp(min=1.0), torch.ones_like(t))
    bonus = gamma * torch.sigmoid(direction * scale * (rel - center))
    return torch.where(valid, a + torch.sign(a) * bonus, a)

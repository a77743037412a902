"""Pass@k-objective advantages (pure torch, no TRL import): Pass@k Training, PKPO and the unlikeliness reward.

Conventions as in ``advantages.py``: ``B = num_prompts * G`` rows, the ``G`` completions of a prompt contiguous.
A NaN reward (a completion no reward function could score) is left out of its group, as TRL leaves it out of the
group mean and std, and gets advantage 0. Combinatorial weights are exact integers (``math.comb``) turned into
float64 ratios, so nothing overflows for any group size TRL allows. Groups are small (G <= a few hundred), so
each group is handled in a short Python loop.
"""

from __future__ import annotations

import math

import torch

from ._utils import check_groups, flat_rows, masked_sum, nanstd, to_f32
from .advantages import group_advantages

__all__ = [
    "passk_advantages",
    "pkpo_transform",
    "pkpo_advantages",
    "pkpo_k_at_step",
    "PKPO_ESTIMATORS",
    "PKPO_K_SCHEDULES",
    "unlikeliness_rewards",
    "UNLIKELY_LOGPS",
    "UNLIKELY_RANK_AMONG",
]

PKPO_ESTIMATORS = ("sloo_minus_one", "sloo", "s")
PKPO_K_SCHEDULES = ("constant", "step", "linear")
UNLIKELY_LOGPS = ("mean", "sum")
UNLIKELY_RANK_AMONG = ("group", "correct")


def _check_k(k: int, name: str = "k"):
    if int(k) != k or k < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {k!r}")


def passk_advantages(
    correct: torch.Tensor, num_generations: int, k: int, valid: torch.Tensor | None = None, scale: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Pass@k Training's analytic advantages (Chen et al. 2025, arXiv 2508.10751, the "analytical derivation" of
    the pass@k advantage).

    In a group of ``N`` completions with ``N_neg`` wrong ones, every k-subset's reward is 1 unless the subset is all
    wrong. Over the ``C(N, k)`` subsets the group reward has mean and std (Bernoulli)::

        R = 1 - C(N_neg, k) / C(N, k),      sigma = sqrt(R (1 - R))

    and the advantage of a completion is the mean advantage of the subsets that contain it::

        A_pos = (1 - R) / sigma
        A_neg = (1 - R - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / sigma

    ``eps`` is added to sigma as in the authors' released code (1e-6), so groups whose subsets all pass (``N_neg < k``)
    or all fail get 0. ``scale=False`` drops the division by sigma (the counterpart of TRL's ``scale_rewards="none"``).
    At ``k = 1`` the advantage is ``(r - mean) / (population std + eps)``: GRPO with binary rewards, up to the
    population-vs-sample std and eps (exactly GRPO's ``r - mean`` with ``scale=False``).

    ``correct``: bool ``(B,)``; ``valid``: bool ``(B,)``, False rows (unscorable) are left out and get 0.
    Returns float32 ``(B,)``. Requires ``k <= N`` (counted over valid rows; a smaller group uses ``k = N``).
    """
    _check_k(k)
    c = flat_rows(correct, "correct").bool()
    v = torch.ones_like(c) if valid is None else flat_rows(valid, "valid").bool()
    n_groups = check_groups(c.shape[0], num_generations)
    out = torch.zeros(c.shape[0], dtype=torch.float64)
    for g in range(n_groups):
        rows = slice(g * num_generations, (g + 1) * num_generations)
        vg, cg = v[rows].cpu(), c[rows].cpu()
        n = int(vg.sum())
        if n == 0:
            continue
        kk = min(int(k), n)
        n_neg = int((vg & ~cg).sum())
        mean = 1.0 - math.comb(n_neg, kk) / math.comb(n, kk)
        sigma = math.sqrt(max(mean * (1.0 - mean), 0.0)) + eps if scale else 1.0
        a_pos = (1.0 - mean) / sigma
        a_neg = (1.0 - mean - math.comb(max(n_neg - 1, 0), kk - 1) / math.comb(n - 1, kk - 1)) / sigma \
            if n_neg > 0 else 0.0
        group = torch.where(cg, torch.tensor(a_pos, dtype=torch.float64), torch.tensor(a_neg, dtype=torch.float64))
        out[rows] = torch.where(vg, group, torch.zeros((), dtype=torch.float64))
    return out.to(torch.float32).to(c.device)


def _subset_weights(n: int, k: int) -> torch.Tensor:
    """``W[i, j]`` (0-based ascending sort positions): the share of the k-subsets containing sample ``i`` whose
    largest member is sample ``j``, i.e. ``C(j-1, k-1)`` for ``j = i`` and ``C(j-2, k-2)`` for ``j > i`` (1-based
    counts), divided by ``C(n-1, k-1)``, the number of k-subsets that contain ``i``."""
    w = torch.zeros(n, n, dtype=torch.float64)
    total = math.comb(n - 1, k - 1)
    for i in range(n):
        w[i, i] = math.comb(i, k - 1) / total
        if k >= 2:
            for j in range(i + 1, n):
                w[i, j] = math.comb(j - 1, k - 2) / total
    return w


def _rho(sorted_g: torch.Tensor, k: int) -> float:
    """Unbiased max@k estimate of ascending-sorted rewards (PKPO Eq. 12): sum_i C(i-1, k-1) g_(i) / C(n, k)."""
    n = sorted_g.numel()
    if k > n:
        raise ValueError(f"k={k} is larger than the {n} samples")
    weights = torch.tensor([math.comb(i, k - 1) for i in range(n)], dtype=torch.float64) / math.comb(n, k)
    return float((weights * sorted_g).sum())


def _pkpo_group(g: torch.Tensor, k: int, estimator: str) -> torch.Tensor:
    """Transformed rewards of one group (float64, original order); see `pkpo_transform`."""
    n = g.numel()
    order = torch.sort(g, stable=True).indices
    sg = g[order]
    s = _subset_weights(n, k) @ sg  # (n/k) s_i: mean over the k-subsets containing i of their max reward
    if estimator in ("sloo", "sloo_minus_one") and n > 1:
        if estimator == "sloo" and k > n - 1:
            raise ValueError(f"pkpo_estimator 'sloo' needs k <= G - 1 (k={k}, G={n}); use 'sloo_minus_one'")
        # The baseline of i at our (n/k) scale is `factor * rho_kb(g without i)` (see `pkpo_transform`).
        kb, factor = (k, n / (n - 1)) if estimator == "sloo" else (max(k - 1, 1), 1.0)
        base = torch.empty(n, dtype=torch.float64)
        for i in range(n):
            rest = torch.cat([sg[:i], sg[i + 1:]])
            base[i] = _rho(rest, kb)
        s = s - (base if factor == 1.0 else factor * base)
    out = torch.empty_like(s)
    out[order] = s
    return out


def pkpo_transform(rewards: torch.Tensor, num_generations: int, k: int, estimator: str = "sloo_minus_one"
                   ) -> torch.Tensor:
    """PKPO's unbiased reward transform for pass@k / max@k (Walder & Karkhanis 2025, arXiv 2505.15201), float32
    ``(B,)``.

    With the group's rewards sorted ascending ``g_(1) <= ... <= g_(n)``, the gradient of the unbiased max@k estimate
    (Eq. 12) gives sample ``i`` the weight ``s_i`` of Eq. 19: the sum over the k-subsets containing ``i`` of their
    largest reward, over ``C(n, k)``. Binary rewards make max@k pass@k. We return ``(n / k) s_i``, i.e. the **mean**
    over the subsets containing ``i`` of their max (the same direction; with this scale ``k = 1`` returns the rewards
    unchanged, so TRL's group normalisation and eps see the rewards they see in GRPO). ``estimator``:

    * ``"s"`` (Eq. 19): no baseline (the caller centres it, as GRPO centres rewards);
    * ``"sloo"`` (Eq. 29): ``s_i - 1/(n-1) * sum_{j != i} S(j, k, [n] without i)``, where ``S(j, k, X)`` is the sum
      of the max over the k-subsets of ``X`` containing ``j``, over ``C(|X|, k)`` (Eq. 27-28, and Eq. 30-31 for the
      ``C(n-1, k)``). The sum over ``j`` counts each k-subset of the others ``k`` times, so the baseline is
      ``k/(n-1) * rho_k(g without i)``, i.e. ``n/(n-1) * rho_k(g without i)`` at our scale. It keeps the gradient
      unbiased but is not centred: the transformed rewards of a group sum to ``-n/(n-1) * rho_k(g)`` (at ``k = 1``:
      ``g_i - n/(n-1) * mean of the others``, not RLOO). Needs ``k <= n - 1``;
    * ``"sloo_minus_one"`` (Eq. 33, the paper's lowest-variance choice, our default): the mean over the subsets
      containing ``i`` of ``max(S) - max(S without i)``, i.e. minus ``rho_{k-1}(g without i)`` at our scale (Eq. 34:
      ``k / (n (k-1)) * b_i^(k-1)`` at the paper's). At ``k = 1`` the (k-1)-subset is empty; like the paper's
      ``k = 1`` runs it then uses the plain leave-one-out baseline of Eq. 26 (RLOO): ``g_i - mean of the others``.

    A NaN reward is left out of its group (and stays NaN); a group with fewer valid rows than ``k`` uses ``k = n``.
    """
    _check_k(k)
    if estimator not in PKPO_ESTIMATORS:
        raise ValueError(f"pkpo_estimator must be one of {', '.join(PKPO_ESTIMATORS)}; got {estimator!r}")
    r = to_f32(flat_rows(rewards, "rewards"))
    n_groups = check_groups(r.shape[0], num_generations)
    out = torch.full(r.shape, float("nan"), dtype=torch.float64)
    rc = r.detach().cpu().to(torch.float64)
    for gi in range(n_groups):
        idx = torch.arange(gi * num_generations, (gi + 1) * num_generations)
        ok = idx[~torch.isnan(rc[idx])]
        if ok.numel() == 0:
            continue
        kk = min(int(k), ok.numel())
        est = "s" if ok.numel() == 1 else estimator
        if est == "sloo" and kk > ok.numel() - 1:
            kk = ok.numel() - 1
        out[ok] = _pkpo_group(rc[ok], kk, est)
    return out.to(torch.float32).to(r.device)


def pkpo_advantages(rewards: torch.Tensor, num_generations: int, k: int, estimator: str = "sloo_minus_one",
                    scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """PKPO advantages, float32 ``(B,)``: `pkpo_transform`, then GRPO's normalisation as TRL applies it.

    ``"s"`` carries no baseline, so it is centred and scaled exactly as TRL treats rewards (`group_advantages`):
    at ``k = 1`` this is GRPO's advantage bit for bit. The baselined estimators already carry the paper's
    leave-one-out baseline (Eq. 29/33), built without sample ``i`` so that it keeps the gradient unbiased; they are
    not re-centred on the group mean, which would depend on ``i`` (Sec. 4.2), only divided by the std (``scale``:
    "group" per group, "batch" over the batch, "none" not at all; ``eps`` as TRL's 1e-4). NaN rewards get 0.
    """
    t = pkpo_transform(rewards, num_generations, k, estimator)
    if estimator == "s":
        return group_advantages(t, num_generations, scale=scale, eps=eps)
    if scale == "group":
        std = nanstd(t.view(-1, num_generations), dim=1).repeat_interleave(num_generations) \
            if num_generations > 1 else torch.zeros_like(t)
    elif scale == "batch":
        std = nanstd(t).expand_as(t) if t.numel() > 1 else torch.zeros_like(t)
    elif scale == "none":
        std = None
    else:
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    adv = t if std is None else t / (std + eps)
    return torch.nan_to_num(adv, nan=0.0)


def pkpo_k_at_step(step: int, k: int, k_final: int | None, anneal_steps: int, schedule: str = "step") -> int:
    """PKPO's k annealing (the paper's "annealing k" experiments): train for pass@k first, then toward pass@1.

    ``"constant"`` (or ``k_final`` None): always ``k``. ``"step"``: ``k`` before ``anneal_steps``, ``k_final``
    from then on (the paper's switch). ``"linear"``: ``k`` moved linearly to ``k_final`` over ``anneal_steps``,
    rounded to the nearest integer (an option of ours; the paper switches once).
    """
    if schedule not in PKPO_K_SCHEDULES:
        raise ValueError(f"pkpo_k_schedule must be one of {', '.join(PKPO_K_SCHEDULES)}; got {schedule!r}")
    if k_final is None or schedule == "constant":
        return int(k)
    if schedule == "step":
        return int(k) if step < anneal_steps else int(k_final)
    frac = 1.0 if anneal_steps <= 0 else min(max(step / anneal_steps, 0.0), 1.0)
    return int(round(k + (k_final - k) * frac))


def unlikeliness_rewards(
    rewards: torch.Tensor, logps: torch.Tensor, mask: torch.Tensor, num_generations: int, beta: float,
    correct: torch.Tensor | None = None, logp: str = "mean", rank_among: str = "group",
) -> torch.Tensor:
    """The unlikeliness reward (He et al. 2025, "Rewarding the Unlikely", arXiv 2506.02355), float32 ``(B,)``::

        r'_i = r_i * (1 - beta * rank_i / G)

    ``rank_i`` in ``0 .. G-1`` orders the group by the policy's likelihood of each completion, **ascending**: the
    least likely completion has rank 0 and keeps its reward, the most likely one is scaled by ``1 - beta (G-1)/G``.
    Wrong completions score 0, so only correct ones change: rare correct samples are up-weighted relative to
    the common ones. The paper writes the rule with ranks over the sampled group and beta = 0.25; choices it leaves
    open, with our defaults taken from the authors' released trainer:

    * ``logp``: the likelihood used to rank, ``"mean"`` (mean token log-prob under the rollout policy, the released
      code; default) or ``"sum"`` (the sequence log-likelihood);
    * ``rank_among``: ``"group"`` ranks all ``G`` completions and divides by ``G`` (released code; default);
      ``"correct"`` ranks only the correct ones (rank in ``0 .. C-1``, divided by ``C``; needs ``correct``).

    Ties are broken by row order (stable sort). NaN rewards stay NaN. ``beta = 0`` returns the rewards unchanged.
    """
    if logp not in UNLIKELY_LOGPS:
        raise ValueError(f"unlikely_logp must be one of {', '.join(UNLIKELY_LOGPS)}; got {logp!r}")
    if rank_among not in UNLIKELY_RANK_AMONG:
        raise ValueError(f"unlikely_rank_among must be one of {', '.join(UNLIKELY_RANK_AMONG)}; got {rank_among!r}")
    r = to_f32(flat_rows(rewards, "rewards"))
    n_groups = check_groups(r.shape[0], num_generations)
    m = mask.to(torch.float32)
    total = masked_sum(to_f32(logps), m, dim=1)
    score = total / m.sum(dim=1).clamp(min=1.0) if logp == "mean" else total
    if rank_among == "correct" and correct is None:
        raise ValueError("unlikely_rank_among='correct' needs the correctness of each row")
    factor = torch.ones_like(r)
    for g in range(n_groups):
        rows = torch.arange(g * num_generations, (g + 1) * num_generations, device=r.device)
        if rank_among == "correct":
            rows = rows[flat_rows(correct, "correct").bool()[rows]]
        if rows.numel() == 0:
            continue
        order = torch.sort(score[rows], stable=True).indices  # ascending likelihood
        rank = torch.empty_like(order)
        rank[order] = torch.arange(rows.numel(), device=r.device)
        factor[rows] = 1.0 - beta * rank.to(torch.float32) / rows.numel()
    return r * factor

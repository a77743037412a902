"""Pass@k-objective advantages (pure torch, no TRL import): Pass@k Training, PKPO and the unlikeliness reward.

Conventions as in ``advantages.py``: ``B = num_prompts * G`` rows, the ``G`` completions of a prompt contiguous.
A NaN reward (a completion no reward function could score) is left out of its group, as TRL leaves it out of the
group mean and std, and gets advantage 0. Combinatorial weights are exact integers (``math.comb``) turned into
float64 ratios, so nothing overflows for any group size TRL allows. Those ratios depend only on the group size, k and a
count (of wrong or scored completions), so they are tabulated once per (G, k) on the host and looked up on the
rewards' device: `passk_advantages`, `pkpo_transform` and `pkpo_advantages` run no Python loop over groups and read
nothing back from the device.
"""

from __future__ import annotations

import functools
import math

import torch

from .advantages import group_advantages
from .utils import check_groups, flat_rows, masked_sum, nanstd, to_f32

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
    v = torch.ones_like(c) if valid is None else flat_rows(valid, "valid").bool().to(c.device)
    n_groups = check_groups(c.shape[0], num_generations)
    cg, vg = c.view(n_groups, num_generations), v.view(n_groups, num_generations)
    n = vg.sum(dim=1)
    n_neg = (vg & ~cg).sum(dim=1)
    all_wrong, wrong_given_wrong = _on_device(_passk_tables, c.device, num_generations, int(k))
    mean = 1.0 - all_wrong[n, n_neg]  # R; a group without a scored row gets 0 below (no valid row)
    a_pos = 1.0 - mean
    a_neg = torch.where(n_neg > 0, 1.0 - mean - wrong_given_wrong[n, n_neg], torch.zeros_like(mean))
    if scale:
        sigma = (mean * (1.0 - mean)).clamp(min=0.0).sqrt() + eps
        a_pos, a_neg = a_pos / sigma, a_neg / sigma
    out = torch.where(cg, a_pos.unsqueeze(1), a_neg.unsqueeze(1))
    out = torch.where(vg, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out.reshape(-1).to(torch.float32)


@functools.lru_cache(maxsize=64)
def _on_device(tables, device: torch.device, *key) -> tuple[torch.Tensor, ...]:
    """`tables(*key)` moved to `device` once (the copy to an accelerator is made on the first call only)."""
    return tuple(t.to(device) for t in tables(*key))


@functools.lru_cache(maxsize=64)
def _passk_tables(size: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k Training's two combinatorial ratios for every group that a group of ``size`` rows can be, float64
    ``(size + 1, size + 1)`` tables indexed ``[n, n_neg]`` (``n`` scored rows, ``n_neg`` of them wrong, ``k' = min(k,
    n)``): ``C(n_neg, k') / C(n, k')``, the share of k'-subsets that are all wrong, and ``C(n_neg - 1, k' - 1) /
    C(n - 1, k' - 1)``, the share of those containing a given wrong completion that are all wrong (0 for ``n_neg =
    0``). Exact integer ratios, each rounded once to float64 (Python's int division). Built on the host once per
    ``(size, k)``: a loop over the possible counts, never over a batch's groups."""
    all_wrong = [[0.0] * (size + 1) for _ in range(size + 1)]
    wrong_given_wrong = [[0.0] * (size + 1) for _ in range(size + 1)]
    for n in range(1, size + 1):
        kk = min(k, n)
        subsets, with_one = math.comb(n, kk), math.comb(n - 1, kk - 1)
        for n_neg in range(n + 1):
            all_wrong[n][n_neg] = math.comb(n_neg, kk) / subsets
            if n_neg > 0:
                wrong_given_wrong[n][n_neg] = math.comb(n_neg - 1, kk - 1) / with_one
    return (torch.tensor(all_wrong, dtype=torch.float64), torch.tensor(wrong_given_wrong, dtype=torch.float64))


def _pkpo_kk(n: int, k: int, estimator: str) -> tuple[int, int, float]:
    """For a group of ``n`` scored rewards: the k it uses, the k of its leave-one-out baseline (0: none) and the
    baseline's factor (see `pkpo_transform`). One scored reward has no other to compare with: no baseline (``"s"``)."""
    kk = min(k, n)
    if n == 1 or estimator == "s":
        return kk, 0, 0.0
    if estimator == "sloo":
        kk = min(kk, n - 1)
        return kk, kk, n / (n - 1)
    return kk, max(kk - 1, 1), 1.0  # sloo_minus_one


@functools.lru_cache(maxsize=64)
def _pkpo_tables(size: int, k: int, estimator: str) -> tuple[torch.Tensor, ...]:
    """PKPO's weights for every group that a group of ``size`` rows can be, float64 tables indexed ``[n, j]`` (``n``
    scored rewards, ``j`` a 0-based position in their ascending order; 0 past ``n``):

    * ``own[n, j] = C(j, k'-1) / C(n-1, k'-1)``: the share of the k'-subsets containing sample ``j`` whose largest
      member is ``j`` itself;
    * ``above[n, j] = C(j-1, k'-2) / C(n-1, k'-1)`` (``j >= 1``, ``k' >= 2``): the share of those containing a smaller
      sample ``i < j`` whose largest member is ``j``;
    * ``loo[n, p] = C(p, kb-1) / C(n-1, kb)``: the weight of the ``p``-th smallest of the other ``n - 1`` rewards in
      ``rho_kb`` (Eq. 12), the leave-one-out baseline's estimate;
    * ``factor[n]``: the baseline's factor (0 where there is none).

    So that ``s_i = own[i] g_i + sum_{j > i} above[j] g_j`` and the baseline of ``i`` is ``sum_{p < i} loo[p] g_p +
    sum_{p > i} loo[p - 1] g_p``: prefix and suffix sums over the sorted group, no per-group loop. The first two are
    exact integer ratios rounded once; ``loo`` divides the two counts as floats, as PKPO's ``rho`` does. Built on the
    host once per ``(size, k, estimator)``."""
    own = [[0.0] * size for _ in range(size + 1)]
    above = [[0.0] * size for _ in range(size + 1)]
    loo = [[0.0] * size for _ in range(size + 1)]
    factor = [0.0] * (size + 1)
    for n in range(1, size + 1):
        kk, kb, factor[n] = _pkpo_kk(n, k, estimator)
        with_j = math.comb(n - 1, kk - 1)
        for j in range(n):
            own[n][j] = math.comb(j, kk - 1) / with_j
            if kk >= 2 and j >= 1:
                above[n][j] = math.comb(j - 1, kk - 2) / with_j
        if kb:
            subsets = float(math.comb(n - 1, kb))
            for p in range(n - 1):
                loo[n][p] = float(math.comb(p, kb - 1)) / subsets
    return tuple(torch.tensor(t, dtype=torch.float64) for t in (own, above, loo, factor))


def _suffix_after(x: torch.Tensor) -> torch.Tensor:
    """``out[:, i] = sum_{j > i} x[:, j]`` (a reversed cumulative sum, shifted by one)."""
    total = x.flip(1).cumsum(1).flip(1)
    return torch.cat([total[:, 1:], torch.zeros_like(total[:, :1])], dim=1)


def _prefix_before(x: torch.Tensor) -> torch.Tensor:
    """``out[:, i] = sum_{j < i} x[:, j]``."""
    total = x.cumsum(1)
    return torch.cat([torch.zeros_like(total[:, :1]), total[:, :-1]], dim=1)


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
    grouped = r.detach().to(torch.float64).view(n_groups, num_generations)
    ordered, order = torch.sort(grouped, dim=1, stable=True)  # ascending; NaN (unscored) last, in row order
    scored = ~torch.isnan(ordered)
    n = scored.sum(dim=1)
    own, above, loo, factor = _on_device(_pkpo_tables, r.device, num_generations, int(k), estimator)
    g = torch.where(scored, ordered, torch.zeros((), dtype=ordered.dtype, device=ordered.device))
    s = own[n] * g + _suffix_after(above[n] * g)  # (n/k) s_i: the mean over the subsets containing i of their max
    loo_n = loo[n]
    shifted = torch.cat([torch.zeros_like(loo_n[:, :1]), loo_n[:, :-1]], dim=1)  # loo[p - 1] at position p
    base = _prefix_before(loo_n * g) + _suffix_after(shifted * g)  # rho_kb of the group without sample i
    f = factor[n].unsqueeze(1)
    s = torch.where(f == 1.0, s - base, s - f * base)  # factor 0 (no baseline): s - 0 * base = s
    s = torch.where(scored, s, torch.full((), float("nan"), dtype=s.dtype, device=s.device))
    out = torch.empty_like(s).scatter_(1, order, s)
    return out.reshape(-1).to(torch.float32)


def pkpo_advantages(rewards: torch.Tensor, num_generations: int, k: int, estimator: str = "sloo_minus_one",
                    scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """PKPO advantages, float32 ``(B,)``: `pkpo_transform`, then GRPO's normalisation as TRL applies it.

    ``"s"`` carries no baseline, so it is centred and scaled exactly as TRL treats rewards (`group_advantages`):
    at ``k = 1`` this is GRPO's advantage bit for bit. The baselined estimators already carry the paper's
    leave-one-out baseline (Eq. 29/33), built without sample ``i`` so that it keeps the gradient unbiased; they are
    not re-centred on the group mean, which would depend on ``i`` (Sec. 4.2), only divided by the std (``scale``:
    "group" per group, "batch" over the batch, "none" not at all; ``eps`` as TRL's 1e-4). NaN rewards get 0.

    A group with one scored reward gets 0, whatever ``estimator`` and ``scale``: its leave-one-out baseline and its
    std are undefined (no other sample), and every other group-relative advantage of the package (GRPO as TRL computes
    it, Pass@k Training, MaxRL, QAE) gives such a group 0 too. (Before, the baselined estimators returned its raw
    reward, divided by ``eps`` when ``num_generations`` was 1.) The other groups' numbers are unchanged (such a group's
    transformed reward still counts in the batch std of ``scale="batch"``, as before).
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
    alone = (~torch.isnan(t)).view(-1, num_generations).sum(dim=1) < 2
    adv = torch.where(alone.repeat_interleave(num_generations), torch.zeros_like(adv), adv)
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

"""Per-token loss terms and token selections (pure torch, no TRL import).

``(B, T)`` tensors are right-padded, ``mask`` is 1 on real tokens. ``advantages`` may be ``(B,)``,
``(B, 1)`` or ``(B, T)`` and are broadcast per token. Every result is float32 ``(B, T)`` (bool for
the selections); inputs are never modified in place.
"""

from __future__ import annotations

import torch

from .utils import as_valid, broadcast_advantages, masked_mean, to_f32

__all__ = [
    "forking_mask",
    "casp_ratio",
    "token_covariance",
    "kl_cov_select",
    "clip_cov_select",
    "kl_cov_per_token_loss",
    "clip_cov_per_token_loss",
]


def forking_mask(entropies: torch.Tensor, mask: torch.Tensor, quantile: float = 0.8) -> torch.Tensor:
    """High-entropy "forking" tokens of each response, bool ``(B, T)``.

    CaSP Sec. 4: per response, ``thr = quantile(entropy of its valid tokens, quantile)`` (linear
    interpolation, as ``torch.quantile``) and a valid token forks when ``entropy > thr`` (strict).
    Only these few branching tokens get the top-N smoothing / top-1 penalty, so the many
    low-entropy tokens keep the plain GRPO update. A row with no valid token has none.
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    valid = as_valid(mask)
    e = to_f32(entropies.detach())
    if e.shape != valid.shape or e.dim() != 2:
        raise ValueError(f"entropies and mask must both be (B, T); got {tuple(e.shape)} and {tuple(valid.shape)}")
    masked = torch.where(valid, e, torch.full_like(e, float("nan")))
    # nanquantile skips the NaN padding, i.e. it is torch.quantile(entropies[row][valid[row]], q);
    # an all-padding row gives a NaN threshold, and "e > NaN" is False.
    thr = torch.nanquantile(masked, quantile, dim=-1, keepdim=True, interpolation="linear")
    return valid & (e > thr)


def casp_ratio(
    log_ratio: torch.Tensor,
    topn_log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    forking: torch.Tensor,
    is_top1: torch.Tensor,
    alpha: float = 0.01,
    top1_penalty: float = 1.1,
) -> torch.Tensor:
    """CaSP importance ratio, float32 ``(B, T)`` (arXiv 2510.14807, Eq. 4 gamma+, Eq. 5 gamma-, App. A, Figure 10).

    Seed "Beyond the Sampled Token". ``r = exp(log_ratio)``, ``aux = sum_n (r'/r_n') * r_n`` with
    ``'`` a stop-gradient, ``w = forking``:
    - ``A > 0``: ``(1 - alpha*w) r + (alpha*w/N) aux``. Its value is ``r`` (so clipping and logging
      are unchanged) but its gradient w.r.t. the logits is
      ``r [(1-alpha w)(e_y - p) + (alpha w / N) sum_n (e_n - p)]``: the positive target is smoothed
      over the old policy's top-N candidates at forking tokens, so reinforcing one path does not
      starve its plausible alternatives (Eq. 4).
    - ``A < 0`` on a forking token whose sampled token is the rank-1 candidate: ``top1_penalty * r``
      (Eq. 5), pushing harder against an over-confident wrong branch.
    - elsewhere ``r``.
    The caller applies the usual clipped objective to the result.
    """
    lr = to_f32(log_ratio)
    tlr = to_f32(topn_log_ratio)
    if lr.dim() != 2:
        raise ValueError(f"log_ratio must be (B, T); got {tuple(lr.shape)}")
    if tlr.dim() != 3 or tlr.shape[:2] != lr.shape or tlr.shape[-1] < 1:
        raise ValueError(f"topn_log_ratio must be (B, T, N) with N >= 1; got {tuple(tlr.shape)}")
    n_top = tlr.shape[-1]
    a = broadcast_advantages(advantages.detach(), lr.shape)
    fork = as_valid(forking)
    top1 = as_valid(is_top1)
    w = fork.to(torch.float32)

    r = torch.exp(lr)
    # (r'/r_n') * r_n == r' * exp(l_n - l_n'): same value (r') and gradient (r' * dl_n), no inf/inf.
    aux = r.detach() * torch.exp(tlr - tlr.detach()).sum(dim=-1)
    positive = (1.0 - alpha * w) * r + (alpha * w / n_top) * aux
    penalised = top1_penalty * r
    out = torch.where(a > 0, positive, r)
    return torch.where((a < 0) & top1 & fork, penalised, out)


def token_covariance(logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     means: tuple[float, float] | None = None) -> torch.Tensor:
    """Per-token centred covariance ``(A - mean(A)) * (lp - mean(lp))``, float32 ``(B, T)``.

    Cui et al. 2025 ("The Entropy Mechanism of RL for Reasoning LMs"), KL-Cov / Clip-Cov covariance:
    means are taken over all valid tokens of the micro-batch, ``lp = logps.detach()``, ``A`` broadcast
    per token. Tokens with the largest covariance are the ones that drive entropy collapse. Padding
    positions hold NaN. ``means = (mean(lp), mean(A))`` replaces the micro-batch means, e.g. by the means over
    every micro-batch and process of an optimizer step (``cov_selection: global``).
    """
    valid = as_valid(mask)
    lp = to_f32(logps.detach())
    a = broadcast_advantages(advantages.detach(), lp.shape)
    mean_lp, mean_a = (masked_mean(lp, valid), masked_mean(a, valid)) if means is None else means
    cov = (a - mean_a) * (lp - mean_lp)
    return torch.where(valid, cov, torch.full_like(cov, float("nan")))


def kl_cov_select(
    logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, kl_cov_ratio: float = 0.002
) -> torch.Tensor:
    """KL-Cov token selection, bool ``(B, T)`` (Cui et al. 2025, KL-Cov, as its official code).

    The ``k = max(1, int(n_valid * kl_cov_ratio))`` valid tokens with the largest covariance
    (``token_covariance``) over the micro-batch; none when ``kl_cov_ratio == 0`` or nothing is valid.
    Only these high-covariance tokens receive the KL penalty, which slows entropy collapse where it
    happens while leaving the rest of the update untouched.
    """
    valid = as_valid(mask)
    selected = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)
    n_valid = int(valid.sum().item())
    if kl_cov_ratio <= 0 or n_valid == 0:
        return selected
    k = min(max(1, int(n_valid * kl_cov_ratio)), n_valid)
    cov = token_covariance(logps, advantages, valid)
    flat = torch.where(valid, cov, torch.full_like(cov, -float("inf"))).reshape(-1)
    flat = torch.nan_to_num(flat, nan=-float("inf"))
    idx = torch.topk(flat, k, largest=True).indices
    return selected.reshape(-1).index_fill(0, idx, True).reshape(valid.shape)


def kl_cov_per_token_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kl_cov_ratio: float = 0.002,
    kl_coef: float = 1.0,
) -> torch.Tensor:
    """KL-Cov per-token loss, float32 ``(B, T)`` (Cui et al. 2025, arXiv 2505.22617, KL-Cov, as its official code;
    no numbered equation is pinned).

    ``-A * exp(logps - old_logps)`` on every valid token (no clipping) plus
    ``kl_coef * |logps - old_logps|`` on the tokens chosen by ``kl_cov_select``; 0 on padding.
    ``logps`` carries the gradient. When fully on-policy (``old_logps == logps.detach()``) the
    penalty has zero gradient (d|x|/dx = 0 at 0); it acts once a rollout feeds several optimizer steps.
    """
    valid, log_ratio, a = _log_ratio_terms(logps, old_logps, advantages, mask)
    selected = kl_cov_select(logps, advantages, valid, kl_cov_ratio)
    loss = -a * torch.exp(log_ratio) + kl_coef * selected.to(torch.float32) * log_ratio.abs()
    return torch.where(valid, loss, loss.new_zeros(()))


def _log_ratio_terms(logps, old_logps, advantages, mask):
    """``(valid, log_ratio, A)``, float32: ``logps - old_logps`` with ``old_logps`` detached (0 on padding), and
    the advantages broadcast per token. Gradients flow through ``logps`` and ``advantages`` as given."""
    valid = as_valid(mask)
    lp = to_f32(logps)
    log_ratio = torch.where(valid, lp - to_f32(old_logps).detach(), lp.new_zeros(()))
    return valid, log_ratio, broadcast_advantages(advantages, lp.shape)


def _clipped_surrogates(log_ratio, a, epsilon_low, epsilon_high):
    ratio = torch.exp(log_ratio)
    pg1 = -a * ratio
    pg2 = -a * torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    return pg1, pg2


def clip_cov_select(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_cov_ratio: float = 2e-4,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Clip-Cov token selection, bool ``(B, T)``: the tokens whose gradient is cut (Cui et al. 2025).

    Candidates are valid tokens not already clipped by the PPO surrogate (``pg2 > pg1``) with
    ``cov_lb < cov < cov_ub`` (``token_covariance``); ``min(max(1, int(n_valid*clip_cov_ratio)),
    n_candidates)`` of them are drawn uniformly at random with ``generator`` (a
    ``torch.randperm`` over the candidates in row-major order). Detaching a small random subset of
    high-covariance tokens limits entropy collapse without the bias of always dropping the top ones.
    """
    valid = as_valid(mask)
    _, log_ratio, a = _log_ratio_terms(logps.detach(), old_logps, advantages.detach(), valid)
    pg1, pg2 = _clipped_surrogates(log_ratio, a, epsilon_low, epsilon_high)
    cov = token_covariance(logps, a, valid)
    candidates = (valid & ~(pg2 > pg1) & (cov > cov_lb) & (cov < cov_ub)).reshape(-1)
    # The one host read: both counts together (the draw's size and the number drawn depend on them).
    n_valid, n_cand = torch.stack([valid.sum(), candidates.sum()]).tolist()
    if n_valid == 0 or n_cand == 0:
        return torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)
    n_sel = min(max(1, int(n_valid * clip_cov_ratio)), n_cand)
    perm_device = generator.device if generator is not None else torch.device("cpu")
    perm = torch.randperm(n_cand, generator=generator, device=perm_device)[:n_sel]
    # Candidate number c (row-major) is drawn when c is among the first n_sel of the permutation.
    drawn = torch.zeros(n_cand, dtype=torch.bool, device=valid.device)
    drawn[perm.to(valid.device, non_blocking=True)] = True
    ordinal = (candidates.cumsum(0) - 1).clamp(min=0)
    return (candidates & drawn[ordinal]).reshape(valid.shape)


def clip_cov_per_token_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_cov_ratio: float = 2e-4,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Clip-Cov per-token loss ``max(pg1, pg2) * corr``, float32 ``(B, T)`` (Cui et al. 2025, arXiv 2505.22617,
    Clip-Cov, as its official code; no numbered equation is pinned).

    ``pg1 = -A r``, ``pg2 = -A clip(r, 1-epsilon_low, 1+epsilon_high)``; ``corr`` is 0 on the tokens
    chosen by ``clip_cov_select`` (so they contribute neither loss nor gradient) and 1 elsewhere;
    0 on padding. ``logps`` carries the gradient.
    """
    valid, log_ratio, a = _log_ratio_terms(logps, old_logps, advantages, mask)
    pg1, pg2 = _clipped_surrogates(log_ratio, a, epsilon_low, epsilon_high)
    selected = clip_cov_select(
        logps, old_logps, advantages, valid, clip_cov_ratio, cov_lb, cov_ub, epsilon_low, epsilon_high, generator
    )
    loss = torch.maximum(pg1, pg2) * (~selected).to(torch.float32)
    return torch.where(valid, loss, loss.new_zeros(()))

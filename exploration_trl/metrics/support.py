"""Support / uncertainty metrics on per-token distributions (torch).

Every function works on *rows* of per-position quantities so that callers can process a long
batch in chunks (e.g. ``logits[i:i+chunk].log_softmax(-1)``) and combine the pieces
(concatenate per-position outputs, or accumulate sums and counts).

Shape conventions used below:

* ``N`` positions (tokens), ``V`` vocabulary entries.
* ``logprobs``: ``(N, V)`` rows of log-softmax values (``-inf`` allowed for zero-probability
  entries).  Leading batch dimensions ``(..., V)`` are also accepted; outputs then keep them.
* ``entropies`` / ``sampled_logps`` / ``mask``: per-token tensors of the same shape, typically
  ``(B, T)`` completions x tokens; ``mask`` is bool or 0/1 and marks valid (non-padding) tokens.
* ``correct``: ``(B,)`` bool/0-1 flags, one per completion (row of ``entropies``).

Heavy per-vocabulary computations (:func:`branching_factor`, :func:`expected_distinct_tokens`) run
in ``compute_dtype`` (float64 by default) and allocate a few ``(N, V)`` buffers: chunk ``N``
accordingly on large vocabularies.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "token_entropy_stats",
    "entropy_by_correctness",
    "branching_factor",
    "rank_logprobs",
    "lambda_n",
    "lambda_sample",
    "expected_distinct_tokens",
]

_NAN = float("nan")


def _bool_mask(mask, like: torch.Tensor) -> torch.Tensor:
    if mask is None:
        return torch.ones_like(like, dtype=torch.bool)
    mask = torch.as_tensor(mask, device=like.device)
    if mask.shape != like.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match values shape {tuple(like.shape)}")
    return mask.bool()


def token_entropy_stats(entropies: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """Summary statistics of per-token entropies over the valid tokens.

    Args:
        entropies: ``(B, T)`` (any shape) per-token entropies in nats.
        mask: same shape, bool/0-1, True for valid tokens; ``None`` = all valid.

    Returns:
        ``dict(mean, std, median, p90, max, count)``; floats (``count`` an int).  ``std`` is the
        population standard deviation, ``median``/``p90`` use linear interpolation (numpy's
        default).  All statistics are NaN when there is no valid token.
    """
    entropies = torch.as_tensor(entropies)
    m = _bool_mask(mask, entropies)
    vals = entropies.detach()[m].to(torch.float64).cpu().numpy()
    if vals.size == 0:
        return dict(mean=_NAN, std=_NAN, median=_NAN, p90=_NAN, max=_NAN, count=0)
    return dict(
        mean=float(vals.mean()),
        std=float(vals.std()),
        median=float(np.percentile(vals, 50)),
        p90=float(np.percentile(vals, 90)),
        max=float(vals.max()),
        count=int(vals.size),
    )


def entropy_by_correctness(entropies: torch.Tensor, mask: torch.Tensor | None, correct) -> dict[str, float]:
    """Token-weighted mean entropy of correct vs. wrong completions.

    Args:
        entropies: ``(B, T)`` per-token entropies.
        mask: ``(B, T)`` valid-token mask (``None`` = all valid).
        correct: ``(B,)`` bool/0-1 correctness of each completion.

    Returns:
        ``dict(correct=..., wrong=...)``: sum of valid-token entropies over the completions of
        that group divided by their number of valid tokens; NaN when the group has no token.
    """
    entropies = torch.as_tensor(entropies)
    if entropies.ndim < 1:
        raise ValueError("entropies must have a leading completion dimension")
    m = _bool_mask(mask, entropies)
    correct = torch.as_tensor(correct, device=entropies.device).bool().reshape(-1)
    if correct.shape[0] != entropies.shape[0]:
        raise ValueError(f"{correct.shape[0]} correctness flags for {entropies.shape[0]} completions")
    e = entropies.detach().to(torch.float64).masked_fill(~m, 0.0)
    flat_e = e.reshape(e.shape[0], -1).sum(-1)
    flat_n = m.reshape(m.shape[0], -1).sum(-1)
    out = {}
    for key, sel in (("correct", correct), ("wrong", ~correct)):
        n = int(flat_n[sel].sum())
        out[key] = float(flat_e[sel].sum()) / n if n > 0 else _NAN
    return out


#: Rows whose top-p mass lies within this many top candidates are settled by a partial top-k (trained LMs).
HEAD_CANDIDATES = 64
#: Log-probability buckets per row for the remaining rows: tokens of higher buckets all precede the bucket where
#: the cumulative mass crosses top-p, so only that bucket's few tokens are ever sorted.
_BUCKETS = 4096


def branching_factor(
    logprobs: torch.Tensor,
    top_p: float = 0.95,
    *,
    atol: float = 1e-6,
    compute_dtype: torch.dtype = torch.float64,
    top_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """Number of candidates inside the top-p probability mass at each position.

    For each row, the smallest number ``m`` of highest-probability tokens whose cumulative
    probability is ``>= top_p`` (STILL, Sec. 2.2).  ``atol`` absorbs rounding of the cumulative
    sum (a row whose top-2 mass is 0.95 up to float error counts as reaching ``top_p=0.95``); the
    result is clamped to ``[1, V]`` (rows that never reach ``top_p``, e.g. ``top_p=1`` with
    round-off, give ``V``).

    Exact without sorting whole vocabulary rows: peaked rows are settled by a partial top-k; the others are
    split into log-probability buckets, the bucket where the cumulative mass crosses ``top_p`` is found from
    per-bucket masses (summed in ``compute_dtype``), and only that bucket's tokens are ordered. The count equals
    the sort-and-cumsum definition (tested against it) at a few passes over the row instead of a full sort.

    Args:
        logprobs: ``(N, V)`` (or ``(..., V)``) log-softmax rows.
        top_p: target mass in ``(0, 1]``.
        top_values: the rows' largest log-probabilities, sorted descending (``(N, k)``, ``k >= min(V, 64)``), when
            the caller already ordered them (`ops.lm_head.token_statistics`): saves one pass over the vocabulary.

    Returns:
        ``(N,)`` (or ``(...)``) ``torch.long`` tensor.
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    logprobs = torch.as_tensor(logprobs).detach()
    lead, vocab = logprobs.shape[:-1], logprobs.shape[-1]
    lp = logprobs.reshape(-1, vocab)
    target = top_p - atol
    out = torch.empty(lp.shape[0], dtype=torch.long, device=lp.device)
    if lp.shape[0] == 0:
        return out.reshape(lead)

    k = min(vocab, HEAD_CANDIDATES)
    if top_values is None or top_values.shape[-1] < k:
        top_values = lp.topk(k, dim=-1).values
    head = top_values.reshape(-1, top_values.shape[-1])[:, :k].to(compute_dtype).exp().cumsum(dim=-1)
    out[:] = (head < target).sum(dim=-1) + 1
    if vocab > HEAD_CANDIDATES:
        # Every row goes through the buckets (no host read to pick the unsettled ones); the head's count stands
        # where the top `HEAD_CANDIDATES` candidates reach the target.
        settled = head[:, -1] >= target
        out = torch.where(settled, out, _bucketed_top_p_count(lp, target, compute_dtype))
    return out.clamp(min=1, max=vocab).reshape(lead)


def _bucketed_top_p_count(lp: torch.Tensor, target: float, dtype: torch.dtype) -> torch.Tensor:
    """`branching_factor` by buckets: per-bucket masses, then the crossing bucket's tokens ordered, every row at once.

    One host read: the largest crossing bucket over the rows, which sizes the partial sort.
    """
    rows, vocab = lp.shape
    hi = lp.amax(dim=-1, keepdim=True)
    # Any lower edge is exact as long as buckets rise with log-probability (tokens below it join bucket 0). The row's
    # lowest value, floored at hi - 1000 where a float64 probability is 0 (rows with -inf tokens), gives fine buckets.
    lo = torch.maximum(lp.amin(dim=-1, keepdim=True), hi - 1000.0)
    width = hi - lo
    scale = torch.where(width > 0, _BUCKETS / width.clamp(min=torch.finfo(lp.dtype).tiny), torch.zeros_like(width))
    # Buckets rise with log-probability; zero-probability tokens (-inf) land in bucket 0 with no mass.
    bucket = (lp - lo).mul_(scale).clamp_(0, _BUCKETS - 1).long()
    probs = lp.to(dtype).exp_()
    mass = probs.new_zeros(rows, _BUCKETS).scatter_add_(1, bucket, probs)
    count = torch.zeros(rows, _BUCKETS, dtype=torch.long, device=lp.device).scatter_add_(
        1, bucket, torch.ones(1, 1, dtype=torch.long, device=lp.device).expand_as(bucket)
    )
    # mass_from[j]: mass of buckets >= j. The crossing bucket is the highest one whose mass from the top reaches
    # the target (none: the row never reaches it, and every token counts).
    mass_from = torch.cat([mass.flip(-1).cumsum(-1).flip(-1), mass.new_zeros(rows, 1)], dim=-1)
    count_from = torch.cat([count.flip(-1).cumsum(-1).flip(-1), count.new_zeros(rows, 1)], dim=-1)
    idx = torch.arange(_BUCKETS, device=lp.device).expand(rows, -1)
    crossing = torch.where(mass_from[:, :-1] >= target, idx, torch.full_like(idx, -1)).amax(dim=-1)
    reached = crossing >= 0
    j = crossing.clamp(min=0)[:, None]
    above_mass, above_count = mass_from.gather(1, j + 1), count_from.gather(1, j + 1)
    n_in = count.gather(1, j).squeeze(1) * reached
    width_in = int(n_in.max()) if rows else 0  # the one host read
    # The crossing bucket's tokens, highest first: ordered in lp's own dtype (exp is monotone, so the order of the
    # probabilities), then their float64 probabilities read back. Rows that never reach the target select nothing.
    j = torch.where(reached[:, None], j, torch.full_like(j, -1))
    order = lp.masked_fill(bucket != j, -float("inf")).topk(max(width_in, 1), dim=-1).indices
    inside = probs.gather(1, order)
    real = torch.arange(inside.size(1), device=lp.device) < n_in[:, None]
    cum = above_mass + torch.where(real, inside, 0.0).cumsum(-1)
    needed = ((cum < target) & real).sum(dim=-1) + 1
    counted = above_count.squeeze(1) + torch.minimum(needed, n_in)
    return torch.where(reached, counted, torch.full_like(counted, vocab))


def rank_logprobs(logprobs: torch.Tensor, n: int = 3) -> torch.Tensor:
    """Log-probabilities of the rank-1..n candidates at each position (CaSP, Eq. 2).

    Args:
        logprobs: ``(N, V)`` (or ``(..., V)``) log-softmax rows.
        n: number of ranks, ``1 <= n <= V``.

    Returns:
        ``(N, n)`` (or ``(..., n)``) tensor, column ``j`` = log-prob of the (j+1)-th most likely
        token (descending order).
    """
    logprobs = torch.as_tensor(logprobs)
    if not 1 <= n <= logprobs.shape[-1]:
        raise ValueError(f"n must be in [1, V={logprobs.shape[-1]}], got {n}")
    return torch.topk(logprobs.detach(), n, dim=-1, largest=True, sorted=True).values


def lambda_n(topk_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> list[float]:
    """Λ(n) for every rank n: the mean over valid positions of the rank-n log-probability.

    Args:
        topk_logprobs: ``(..., n)`` output of :func:`rank_logprobs` (e.g. ``(B, T, n)`` or ``(N, n)``).
        mask: ``(...)`` valid-position mask matching the leading dims (``None`` = all valid).

    Returns:
        ``[Λ(1), ..., Λ(n)]`` as floats; all NaN when there is no valid position.
    """
    topk_logprobs = torch.as_tensor(topk_logprobs)
    lead = topk_logprobs[..., 0]
    m = _bool_mask(mask, lead)
    count = int(m.sum())
    n = topk_logprobs.shape[-1]
    if count == 0:
        return [_NAN] * n
    vals = topk_logprobs.detach().to(torch.float64)[m]  # (count, n)
    return [float(v) for v in (vals.sum(0) / count).cpu()]


def lambda_sample(sampled_logps: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """Λ(sample): mean over valid positions of the log-probability of the sampled token.

    Args:
        sampled_logps: ``(B, T)`` (any shape) per-token log-probs of the generated tokens.
        mask: same shape valid-token mask (``None`` = all valid).

    Returns:
        float; NaN when there is no valid position.
    """
    sampled_logps = torch.as_tensor(sampled_logps)
    m = _bool_mask(mask, sampled_logps)
    count = int(m.sum())
    if count == 0:
        return _NAN
    return float(sampled_logps.detach().to(torch.float64)[m].sum()) / count


def expected_distinct_tokens(
    logprobs: torch.Tensor,
    K: int | float,
    *,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Expected number of distinct tokens among K i.i.d. draws: ``Σ_v 1 - (1 - p_v)^K`` (CaSP, Prop. 3).

    Evaluated as ``Σ_v -expm1(K · log(1 - p_v))`` with ``log(1 - p) = log1mexp(log p)`` (``log(-expm1)``
    for ``p > 1/2``, ``log1p(-exp)`` otherwise), so tiny and near-one probabilities keep full
    precision.  ``K = 1`` gives the row's total mass (1 for a normalised row); as ``K → ∞`` it tends
    to the support size.

    Args:
        logprobs: ``(N, V)`` (or ``(..., V)``) log-softmax rows.
        K: number of draws (> 0).

    Returns:
        ``(N,)`` (or ``(...)``) tensor in ``compute_dtype``.
    """
    if not (isinstance(K, (int, float)) and math.isfinite(K) and K > 0):
        raise ValueError(f"K must be a positive finite number, got {K!r}")
    lp = torch.as_tensor(logprobs).detach().to(compute_dtype)
    lp = lp.clamp(max=0.0)  # guard against tiny positive round-off in log-softmax outputs
    log1m_p = torch.where(
        lp > -math.log(2.0),
        torch.log(-torch.expm1(lp)),
        torch.log1p(-torch.exp(lp)),
    )
    return (-torch.expm1(K * log1m_p)).sum(dim=-1)

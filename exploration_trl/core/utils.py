"""Small tensor helpers shared by the pure-torch core (no TRL imports).

Everything here is side-effect free: inputs are never modified in place, and every statistic is
computed in float32 so that bfloat16 inputs give the same numbers as float32 ones.
"""

from __future__ import annotations

import torch

__all__ = [
    "as_valid",
    "to_f32",
    "masked_mean",
    "masked_sum",
    "nanstd",
    "row_length_mean",
    "broadcast_advantages",
    "split_sequence_advantages",
    "check_groups",
    "flat_rows",
]


def to_f32(x: torch.Tensor) -> torch.Tensor:
    """Return ``x`` as float32 (a no-op view when it already is); gradients flow through the cast."""
    return x if x.dtype == torch.float32 else x.float()


def as_valid(mask: torch.Tensor) -> torch.Tensor:
    """Boolean view of a 0/1 (int, float or bool) mask: True on real tokens."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Sum of ``x`` over positions where ``mask`` is non-zero (padding values, even NaN/inf, ignored)."""
    valid = as_valid(mask)
    x = torch.where(valid, to_f32(x), torch.zeros((), dtype=torch.float32, device=x.device))
    return x.sum() if dim is None else x.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Float32 mean of ``x`` over valid positions; 0 where there is no valid position.

    ``dim=None`` averages over every valid token of the tensor (token-level mean), ``dim=-1`` gives
    one mean per row.
    """
    valid = as_valid(mask)
    total = masked_sum(x, valid, dim=dim)
    count = valid.sum() if dim is None else valid.sum(dim=dim)
    return total / count.clamp(min=1).to(torch.float32)


def row_length_mean(logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sum(logps * mask) / max(n_valid, 1)`` per row, float32 ``(B,)`` (0 for an empty row)."""
    return masked_mean(logps, mask, dim=-1)


def nanstd(x: torch.Tensor, dim=None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased (Bessel-corrected) standard deviation ignoring NaNs; NaN when fewer than 2 values.

    Same convention as TRL's ``nanstd`` (re-implemented here so that ``core`` never imports TRL).
    """
    x = to_f32(x)
    if dim is None:
        x = x.reshape(-1)
        dim = 0
        squeeze_all = not keepdim
    else:
        squeeze_all = False
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    sq = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True).to(torch.float32)
    nan = torch.full_like(sq, float("nan"))
    var = torch.where(count > 1, sq * count / (count - 1).clamp(min=1), nan)
    std = var.sqrt()
    if squeeze_all:
        return std.reshape(())
    return std if keepdim else std.squeeze(dim)


def broadcast_advantages(advantages: torch.Tensor, shape: torch.Size | tuple) -> torch.Tensor:
    """Float32 per-token advantages of ``shape == (B, T)`` from ``(B,)``, ``(B, 1)`` or ``(B, T)``."""
    B, T = shape
    a = to_f32(advantages)
    if a.dim() == 1:
        a = a.unsqueeze(-1)
    if a.dim() != 2 or a.shape[0] != B or a.shape[1] not in (1, T):
        raise ValueError(
            f"advantages must have shape (B,), (B, 1) or (B, T) with B={B}, T={T}; got {tuple(advantages.shape)}"
        )
    return a.expand(B, T)


def split_sequence_advantages(advantages: torch.Tensor, B: int):
    """For sequence-level shaping: return ``(a2d, restore)``.

    ``a2d`` is float32 ``(B, 1)`` for ``(B,)`` / ``(B, 1)`` inputs and ``(B, T)`` for per-token
    inputs; ``restore(out2d)`` gives ``(B,)`` for the former and ``(B, T)`` for the latter.
    """
    a = to_f32(advantages)
    if a.dim() == 1:
        a = a.unsqueeze(-1)
    if a.dim() != 2 or a.shape[0] != B:
        raise ValueError(f"advantages must have shape (B,), (B, 1) or (B, T) with B={B}; got {tuple(advantages.shape)}")
    if a.shape[1] == 1:
        return a, lambda out: out.squeeze(-1)
    return a, lambda out: out


def check_groups(n: int, num_generations: int) -> int:
    """Validate that ``n`` rows split into contiguous groups of ``num_generations``; return #groups."""
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    if n % num_generations != 0:
        raise ValueError(f"batch size {n} is not a multiple of num_generations={num_generations}")
    return n // num_generations


def flat_rows(x: torch.Tensor, name: str) -> torch.Tensor:
    """Per-row vector ``(B,)`` from ``(B,)`` or ``(B, 1)``."""
    if x.dim() == 2 and x.shape[1] == 1:
        x = x.squeeze(-1)
    if x.dim() != 1:
        raise ValueError(f"{name} must have shape (B,) or (B, 1); got {tuple(x.shape)}")
    return x

"""Gathers of per-row and per-token tensors that cannot mismatch across processes.

A collective needs the same shape and dtype on every process. Rollout tensors break both: each process
pads its completions to its own longest one (`T` differs), prompts are left-padded to each process's longest
prompt (`P` differs), and a padding value of another type can silently promote a tensor (accelerate's
`pad_across_processes` adds a float pad value to an int mask, turning it into float32 on the one process that
pads, and gloo then aborts with "Received data size doesn't match expected size"). `gather_rows` settles all
three before gathering: floats travel as float32, bools as uint8, and padding is written with the tensor's
own dtype on the side the layout needs (right for completions, left for prompts).
"""

from __future__ import annotations

import torch
from accelerate.utils import gather

PAD_SIDES = ("right", "left")


def _wire_dtype(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.bool:
        return x.to(torch.uint8)
    if x.is_floating_point() and x.dtype != torch.float32:
        return x.float()
    return x


def pad_to(x: torch.Tensor, size: int, dim: int, value: float, side: str) -> torch.Tensor:
    """`x` padded along `dim` to `size` with `value` (in `x`'s dtype) on `side`."""
    if side not in PAD_SIDES:
        raise ValueError(f"pad side must be one of {', '.join(PAD_SIDES)}; got {side!r}")
    missing = size - x.size(dim)
    if missing <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    filler = torch.full(shape, value, dtype=x.dtype, device=x.device)
    return torch.cat([x, filler] if side == "right" else [filler, x], dim=dim)


def gather_rows(
    x: torch.Tensor, num_processes: int, pad_dim: int | None = None, pad_value: float = 0.0, pad_side: str = "right"
) -> torch.Tensor:
    """Concatenate every process's `x` along dim 0, padding `pad_dim` to the longest first.

    Returns float32 for floating inputs (whatever each process held), the input dtype otherwise (bools stay
    bool). Every process must call it, in the same order, as with any collective.
    """
    out_dtype = torch.float32 if x.is_floating_point() else x.dtype
    wire = _wire_dtype(x).contiguous()
    if num_processes > 1:
        if pad_dim is not None:
            dim = pad_dim % wire.dim()
            sizes = gather(torch.tensor([wire.size(dim)], device=wire.device))
            wire = pad_to(wire, int(sizes.max()), dim, pad_value, pad_side)
        wire = gather(wire)
    return wire.to(out_dtype)

"""The rows of a verl batch grouped by uid, laid out as the package core expects them, without a loop over groups.

verl hands an estimator one uid per row (`non_tensor_batch["uid"]`, a NumPy array on the host) and the rows in any
order (its batch balancing reorders them), in groups of any size. The core functions take `n_groups * size` rows, each
group contiguous, unscored rows marked invalid. The uids are host data, so the grouping (a sort of the uids) is done
on the host once per call; what moves per-row values between the two layouts is one gather or scatter on the
rewards' device. Nothing is read back from the device.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["UidGroups"]


def _group_ids(index, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """`(ids, counts)`: each row's group as an integer in `0..n_groups-1` (groups in order of first appearance), and
    each group's row count."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()  # a tensor of uids is not what verl passes; accepted, read once
    uids = np.asarray(index)
    if uids.ndim != 1 or uids.shape[0] != n_rows:
        raise ValueError(f"index holds {uids.size} uids for {n_rows} rows: verl passes one uid per row")
    try:
        _, first, inverse, counts = np.unique(uids, return_index=True, return_inverse=True, return_counts=True)
    except TypeError:  # uids of mixed types cannot be sorted: compare them as text
        _, first, inverse, counts = np.unique(uids.astype(str), return_index=True, return_inverse=True,
                                              return_counts=True)
    rank = np.empty_like(first)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)  # sorted-uid order -> first-appearance order
    return rank[inverse.reshape(-1)], counts[np.argsort(rank, kind="stable")]


def _to(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`; to an accelerator through pinned memory, asynchronously (a copy from pageable
    memory would wait for the device's queued work)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class UidGroups:
    """The rows of a verl batch grouped by uid (the prompt each completion answers), in any row order and group size.

    `size` is the largest group; the padded layout has `n_groups * size` rows, group `g` in rows `g * size ...`, its
    batch rows in the order they come, then unscored padding (`valid` False there). `pad` lays per-row values out in
    it; `unpad` takes a per-row result back to the batch's order. `sizes` (host) holds each group's row count."""

    def __init__(self, index, n_rows: int, device: torch.device | str | None = None):
        ids, counts = _group_ids(index, n_rows)
        self.n_rows = n_rows
        self.n_groups = int(counts.size)
        self.sizes = counts
        self.size = int(counts.max()) if counts.size else 1
        order = np.argsort(ids, kind="stable")  # rows grouped, each group's rows in batch order
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        position = np.empty(n_rows, dtype=np.int64)
        position[order] = np.arange(n_rows) - starts[ids[order]]
        slot = ids.astype(np.int64) * self.size + position  # each batch row's place in the padded layout
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._ids = ids
        self._slot = _to(torch.from_numpy(slot), self.device)
        valid = np.zeros(self.n_groups * self.size, dtype=bool)
        valid[slot] = True
        #: True on the padded layout's real rows.
        self.valid = _to(torch.from_numpy(valid), self.device)

    def largest(self) -> tuple[int, int]:
        """`(row count, first row)` of the largest group (host data, for messages)."""
        g = int(np.argmax(self.sizes))
        return int(self.sizes[g]), int(np.flatnonzero(self._ids == g)[0])

    def pad(self, per_row: torch.Tensor, fill) -> torch.Tensor:
        out = torch.full((self.n_groups * self.size,), fill, dtype=per_row.dtype, device=per_row.device)
        return out.index_copy_(0, self._slot, per_row)

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        return padded.index_select(0, self._slot)

"""`MetricQueue`: metrics kept on the device until the step that logs, then read with one device-to-host copy.

A metric is a `(sum, count)` pair per name (a device scalar or a Python number each), logged as `sum / count`. Reading
each one when it is computed (`.item()`) makes the host wait for the device every micro-batch; queued, a training
step reads nothing, and the logging step reads them all at once (after one reduce across processes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class _Entry:
    mode: str
    names: list[str]
    is_tensor: list[bool]  # per value (sum, count, sum, count, ... in `names` order)
    tensors: torch.Tensor | None  # the device values, stacked when queued
    numbers: list[float]  # the Python values
    reduce: bool


class MetricQueue:
    """Queued `{name: (sum, count)}` dicts, drained in the order they were added."""

    def __init__(self):
        self._entries: list[_Entry] = []

    def __len__(self) -> int:
        return len(self._entries)

    @torch.no_grad()
    def add(self, mode: str, metrics: dict, reduce: bool = True):
        """Queue `metrics`; `reduce=False`: the values are global already (not summed over processes).

        Values to reduce are kept as float32, as TRL reduces its own metrics (exact for float32 sums and for counts
        below 2^24); the others as float64.
        """
        names = sorted(metrics)
        values = [v for n in names for v in metrics[n]]
        is_tensor = [isinstance(v, torch.Tensor) for v in values]
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        dtype = torch.float32 if reduce else torch.float64
        stacked = torch.stack(tensors).to(dtype) if tensors else None
        numbers = [float(v) for v in values if not isinstance(v, torch.Tensor)]
        self._entries.append(_Entry(mode, names, is_tensor, stacked, numbers, reduce))

    @torch.no_grad()
    def drain(self, device, reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> list[tuple[str, str, float]]:
        """Empty the queue: `[(mode, name, sum / count)]` in the order added, names whose (reduced) count is 0 left
        out. `reduce_sum` sums a tensor over processes (a collective: every process drains at the same point, with
        the same names queued). One device-to-host copy in all."""
        entries, self._entries = self._entries, []
        if not entries:
            return []
        parts, groups = [], []
        for reduce, dtype in ((True, torch.float32), (False, torch.float64)):
            group = [e for e in entries if e.reduce == reduce]
            if not group:
                continue
            pieces = [e.tensors for e in group if e.tensors is not None]
            numbers = [x for e in group for x in e.numbers]
            if numbers:  # the Python values: one asynchronous host-to-device copy
                pieces.append(torch.tensor(numbers, dtype=dtype).to(device, non_blocking=True))
            part = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
            parts.append((reduce_sum(part) if reduce else part).double())
            groups.append(group)
        flat = torch.cat(parts).tolist() if len(parts) > 1 else parts[0].tolist()  # the one device-to-host copy
        values, offset = {}, 0
        for group, part in zip(groups, parts, strict=True):
            tensor_at = offset
            number_at = offset + sum(e.tensors.numel() for e in group if e.tensors is not None)
            for e in group:
                row = []
                for is_tensor in e.is_tensor:
                    if is_tensor:
                        row.append(flat[tensor_at])
                        tensor_at += 1
                    else:
                        row.append(flat[number_at])
                        number_at += 1
                values[id(e)] = row
            offset += part.numel()
        return [(e.mode, name, total / count)
                for e in entries
                for name, total, count in zip(e.names, values[id(e)][::2], values[id(e)][1::2], strict=True)
                if count > 0]  # decided from the reduced count, so every process skips alike

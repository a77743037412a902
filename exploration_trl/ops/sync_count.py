"""Counting the operations that make the host wait for the device (a "sync"), on CPU as on CUDA.

On CUDA a sync stalls the host until every queued kernel has run, so a training step with many of them cannot keep
the GPU busy. CUDA counts them itself (`torch.cuda.set_sync_debug_mode`: `CudaSyncCounter`). A CPU run has no such
counter, so `CpuSyncCounter` records, with `torch.profiler`, the aten ops that force one on CUDA (`SYNC_OPS`: a
scalar read, a boolean-mask compaction, a data-dependent shape) and, with a `TorchFunctionMode`, the tensor methods
that copy device data to the host without an aten op on CPU (`tolist`, `numpy`, `cpu`). An op nested in another
counted op (`item` -> `_local_scalar_dense`) counts once. It also counts every aten op, the work a step dispatches.

Used by `tests/test_sync_budget.py` (the per-step budget of every method) and `benchmarks/overhead.py`.
"""

from __future__ import annotations

import warnings
from collections import Counter
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

#: aten ops that wait for the device on CUDA: a scalar read (`item`, `bool(t)`, `float(t)` all reach
#: `_local_scalar_dense`), a compaction whose output size depends on the data, or a host-side comparison.
SYNC_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero", "aten::nonzero_numpy",
    "aten::argwhere", "aten::masked_select", "aten::equal", "aten::allclose", "aten::unique", "aten::_unique",
    "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim", "aten::bincount", "aten::repeat_interleave",
    "aten::histc", "aten::_assert_async",
})
#: Tensor methods that copy device data to the host (no aten op on CPU, a device-to-host copy on CUDA).
HOST_COPY_METHODS = ("tolist", "numpy", "cpu")


class _HostCopies(TorchFunctionMode):
    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts
        self._methods = {getattr(torch.Tensor, name): name for name in HOST_COPY_METHODS}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = self._methods.get(func)
        if name is not None:
            self.counts[f"Tensor.{name}"] += 1
        return func(*args, **(kwargs or {}))


class CpuSyncCounter:
    """Counts, between `start()` and `stop()`, the sync ops (by name) and every aten op.

    `stop()` returns `{"syncs": int, "by_op": {name: count}, "aten_ops": int}`. Works on any device; on CPU it is the
    estimate of what the same code would sync on CUDA.
    """

    def __init__(self, detail: bool = False):
        self.detail = detail  # also return `all_ops`: every aten op name and its count (to see where work goes)
        self._profiler = None
        self._mode = None
        self._copies: Counter = Counter()

    def start(self):
        self._copies = Counter()
        self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._profiler.__enter__()
        self._mode = _HostCopies(self._copies)
        self._mode.__enter__()

    def stop(self) -> dict:
        self._mode.__exit__(None, None, None)
        self._profiler.__exit__(None, None, None)
        by_op: Counter = Counter(self._copies)
        every: Counter = Counter()
        for event in self._profiler.events():
            if not event.name.startswith("aten::"):
                continue
            every[event.name] += 1
            if event.name in SYNC_OPS and not _inside_sync_op(event):
                by_op[event.name] += 1
        self._profiler = self._mode = None
        out = {"syncs": sum(by_op.values()), "by_op": dict(sorted(by_op.items())), "aten_ops": sum(every.values())}
        if self.detail:
            out["all_ops"] = dict(every.most_common())
        return out


def _inside_sync_op(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in SYNC_OPS:
            return True
        parent = parent.cpu_parent
    return False


class CudaSyncCounter:
    """Counts CUDA's own sync warnings (`torch.cuda.set_sync_debug_mode("warn")`) between `start()` and `stop()`."""

    def __init__(self):
        self._catch = None
        self._records = None

    def start(self):
        self._catch = warnings.catch_warnings(record=True)
        self._records = self._catch.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> dict:
        torch.cuda.set_sync_debug_mode("default")
        self._catch.__exit__(None, None, None)
        syncs = sum("synchronizing" in str(r.message) for r in self._records)
        self._catch = self._records = None
        return {"syncs": syncs}


@contextmanager
def count_syncs(cuda: bool = False):
    """`with count_syncs() as result:` fills the dict `result` with `stop()`'s counts when the block ends."""
    counter = CudaSyncCounter() if cuda else CpuSyncCounter()
    result: dict = {}
    counter.start()
    try:
        yield result
    finally:
        result.update(counter.stop())


def steps_sync_callback(cuda: bool = False, detail: bool = False):
    """A `TrainerCallback` whose `.steps` lists, per optimizer step, the counts from that step's `on_step_begin` to
    the next one (so a step's logging, which HF runs after `on_step_end`, counts in the step that logs)."""
    from transformers import TrainerCallback

    class StepsSyncCallback(TrainerCallback):
        def __init__(self):
            self.steps: list[dict] = []
            self._counter = None

        def _close(self):
            if self._counter is not None:
                self.steps.append(self._counter.stop())
                self._counter = None

        def on_step_begin(self, args, state, control, **kwargs):
            self._close()
            self._counter = CudaSyncCounter() if cuda else CpuSyncCounter(detail)
            self._counter.start()

        def on_train_end(self, args, state, control, **kwargs):
            self._close()

    return StepsSyncCallback()

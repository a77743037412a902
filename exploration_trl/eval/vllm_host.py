"""vLLM on the host, for the vLLM backend of :mod:`exploration_trl.eval.generation`: the memory share a CPU engine is
given, and the one line a failed start becomes."""

from __future__ import annotations

import os

__all__ = ["CPU_KV_CACHE_BYTES", "cpu_memory_utilization", "vllm_start_error"]

#: On a CPU, the KV cache the automatic memory setting aims for: this many bytes, or a quarter of the free RAM if less.
CPU_KV_CACHE_BYTES = 4 * 1024**3


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _host_memory() -> tuple[int, int]:
    """``(total, available)`` bytes of RAM, as vLLM's CPU worker reads them (memory node 0)."""
    try:
        from vllm.utils.cpu_resource_utils import get_memory_node_info

        info = get_memory_node_info(0)
        return int(info.total_memory), int(info.available_memory)
    except Exception:  # noqa: BLE001 - any vLLM layout change: fall back to the whole host
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.total), int(vm.available)


def cpu_memory_utilization(total: int | None = None, available: int | None = None, resident: int | None = None) -> float:
    """vLLM's ``gpu_memory_utilization`` for a CPU host: this process's resident memory plus a KV cache of
    ``min(CPU_KV_CACHE_BYTES, available / 4)``, as a share of the total RAM (vLLM's CPU worker reserves
    ``share * total`` and gives the KV cache what this process does not already use), rounded up to 0.01."""
    import math

    if total is None or available is None:
        total, available = _host_memory()
    if resident is None:
        import psutil

        resident = psutil.Process(os.getpid()).memory_info().rss
    kv = min(CPU_KV_CACHE_BYTES, available // 4)
    return min(0.95, math.ceil(100 * (resident + kv) / total) / 100)


def vllm_start_error(e: BaseException, memory_utilization: float, on_cpu: bool, chosen: bool) -> str:
    """One line: what stopped vLLM and the option that changes it."""
    text = _first_line(e).split(". ")[0]  # vLLM's first sentence; the rest names its own flags, not ours
    if "head_dim" in text or "Unsupported CPU attention" in text:
        fix = "vLLM cannot run this model's attention here; use --backend transformers for this model"
    elif "memory" in text.lower() or "KV cache" in text or "kv cache" in text.lower():
        where = "of the host's RAM" if on_cpu else "of the GPU's memory"
        how = "chosen from the free RAM" if chosen else "given"
        fix = (f"vLLM was asked for {memory_utilization:.2f} {where} ({how}); pass --vllm-memory-utilization with "
               "a share that fits (smaller if memory ran out, larger if the KV cache is too small), or --backend "
               "transformers")
    else:
        fix = "pass --backend transformers to evaluate without vLLM"
    return f"vLLM could not start ({type(e).__name__}: {text}); {fix}"

"""The offline `vllm.LLM` engine of the evaluation harness (the vLLM backend of :mod:`exploration_trl.eval.generation`;
training generates through TRL's engine, `vllm_support.py`): `OfflineEngine` starts one, samples from it and stops
it, in the package's terms (`Completion`); the memory share a CPU engine is given; the one line a failed start
becomes. What to sample, with which settings and seeds, and what the samples mean, is the harness's.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .vllm_engine import shutdown_llm

__all__ = ["CPU_KV_CACHE_BYTES", "Completion", "OfflineEngine", "cpu_memory_utilization", "vllm_start_error"]

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


@dataclass
class Completion:
    """One sampled completion: its text, its token ids (the stop token included), why it stopped (`"stop"` or
    `"length"`) and, position by position, the log-probabilities vLLM returned for its top-k tokens."""

    text: str
    token_ids: list[int]
    finish_reason: str
    topk_logprobs: list[list[float]]


def _topk_logprobs(position: dict, topk: int) -> list[float]:
    """The top-k log-probabilities of one position. vLLM adds the sampled token when it is outside the top-k (its
    `rank` above `topk`): that one is left out."""
    values = []
    for lp in position.values():
        rank = getattr(lp, "rank", None)
        if rank is not None and rank > topk:
            continue
        value = getattr(lp, "logprob", lp)
        if value is not None:
            values.append(value)
    return values


def _completion(output: Any, topk: int) -> Completion:
    return Completion(text=output.text, token_ids=list(output.token_ids),
                      finish_reason="length" if output.finish_reason == "length" else "stop",
                      topk_logprobs=[_topk_logprobs(position, topk) for position in (output.logprobs or [])])


@contextmanager
def _engine_core_in_process(in_process: bool):
    """While vLLM starts, run its engine core in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so that a
    failure to start is an exception here, not a traceback printed by a child process; the variable is restored."""
    previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if in_process:
            if previous is None:
                os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
            else:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = previous


class OfflineEngine:
    """One offline `vllm.LLM` for `model` (a local folder or Hub id): `sample` draws completions, `close` stops it.

    `llm_kwargs` go to `vllm.LLM` as they are (`gpu_memory_utilization`, `max_logprobs`, ...); a failure to start is
    vLLM's exception (`vllm_start_error` makes it one line). `in_process`: the engine core runs in this process."""

    def __init__(self, model: str, tokenizer: str | None = None, dtype: Any = "auto", seed: int = 0,
                 in_process: bool = False, **llm_kwargs):
        from vllm import LLM

        with _engine_core_in_process(in_process):
            self.llm = LLM(model=model, tokenizer=tokenizer, dtype=dtype, seed=seed, **llm_kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def sample(self, prompt_token_ids: list[list[int]], n: int, temperature: float, top_p: float, max_tokens: int,
               seeds: list[int | None], logprobs: int, progress: bool = True) -> list[list[Completion]]:
        """`n` completions of each prompt (given as token ids), prompt `i` sampled with `seeds[i]` (None: the
        engine's generator), each position's top-`logprobs` log-probabilities kept; one list per prompt, in order."""
        from vllm import SamplingParams

        params = [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed,
                                 logprobs=logprobs) for seed in seeds]
        inputs = [{"prompt_token_ids": ids} for ids in prompt_token_ids]
        outputs = self.llm.generate(inputs, params, use_tqdm=progress)
        return [[_completion(c, logprobs) for c in out.outputs] for out in outputs]

    def close(self) -> None:
        """Stop the engine now (`shutdown_llm`); a second call does nothing."""
        llm, self.llm = self.llm, None
        if llm is not None:
            shutdown_llm(llm)

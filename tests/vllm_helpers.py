"""Shared by the vLLM tests (`-m vllm`, run in the vLLM environment: docs/vllm.md).

vLLM's CPU attention needs a head_dim of at least 32, so these tests build the toy Qwen2 with 2 attention heads of 32
(hidden size 64) and 1 key/value head, offline, like every other toy (`exploration_trl.toy`). The vLLM engine runs it
in bfloat16 (vLLM's CPU default for a float32 checkpoint); the trainer keeps float32.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch
from helpers import toy_checkpoint

#: The toy of the other tests with head_dim 64 / 2 = 32.
VLLM_TOY = {"num_attention_heads": 2, "num_key_value_heads": 1}
#: vLLM's `gpu_memory_utilization` is the share of the host's RAM on a CPU; this leaves room for several engines.
CPU_MEMORY_SHARE = 0.15
#: The colocate settings every vLLM training test uses.
COLOCATE = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": CPU_MEMORY_SHARE}
#: TRL's `sampling/sampling_logp_difference/mean` must stay below this on every step (measured: <= 5e-3; a vLLM
#: that kept the step-0 weights logs 0.6 and more from step 2 on, `test_stale_engine_is_detected`).
LOGP_DIFF_TOL = 1e-2


def vllm_checkpoint(path, seed: int = 0, head_scale: float | None = None) -> str:
    """The head_dim-32 toy, saved for `from_pretrained` and vLLM. `head_scale` multiplies the LM head, which makes
    the next-token distributions peaked and context-dependent (a random toy is nearly uniform)."""
    path = Path(toy_checkpoint(path, seed=seed, **VLLM_TOY))
    if head_scale is not None:
        from safetensors.torch import load_file, save_file

        file = path / "model.safetensors"
        tensors = load_file(str(file))
        tensors["lm_head.weight"] = tensors["lm_head.weight"] * head_scale
        save_file(tensors, str(file), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] >= 32
    return str(path)


def logged_steps(trainer) -> list[dict]:
    """The per-step entries of the trainer's log history (not the final summary)."""
    return [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def param_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def params_of(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


#: Characters that count as a "correct" first character for `first_char_reward` (13 of the toy tokenizer's ~100 characters).
FIRST_CHARS = frozenset("abcdefghijklm")


def first_char_reward(completions, **kwargs):
    """1 when a completion starts with a lower-case letter: a reward whose rate differs from prompt to prompt on the
    peaked toy, so that two backends sampling the same distributions agree problem by problem."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [1.0 if t[:1] in FIRST_CHARS else 0.0 for t in texts]


#: Set in this process by TRL's colocate set-up (and accelerate); a child process that inherited them would try to
#: join this process's rendezvous instead of starting its own.
DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def child_env(**extra) -> dict:
    """This process's environment for a child process, without the distributed rendezvous variables."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env.update(extra)
    return env

"""vLLM in the trainers: a weight sync vLLM's CPU backend accepts, vLLM's own log-probs reused for the methods'
rollout statistics, and a clean shutdown (`VLLMSupport`, a component of the trainer; the CPU engine,
`CPUVLLMGeneration`, subclasses TRL's and is defined at the end of this module).

**Weight sync on CPU.** TRL 1.16's colocate sync (`VLLMGeneration.sync_weights`) hands vLLM's model one parameter at
a time to `model.load_weights`. vLLM's CPU backend packs every linear layer's weight for oneDNN when it loads the
model and drops the original parameter (`dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`), so that path
fails with `'Parameter' object has no attribute 'weight_loader'`. When vLLM runs on the CPU, `CPUVLLMGeneration`
sends the whole model through the model runner's `reload_weights(weights_iterator=..., is_checkpoint_format=True)`
(vLLM's layerwise reload, which re-runs the packing). In server mode TRL's client refuses any weight sync off CUDA
(`init_communicator` raises `NotImplementedError`: NCCL only); on a CPU the trainer instead writes its weights to a
safetensors folder and asks the server, through its development endpoint `/collective_rpc`, to run the same
`reload_weights(weights_path=...)` (the server must see the trainer's filesystem: same host). On a GPU nothing here
is used: TRL builds and syncs its own `VLLMGeneration`.

**vLLM's log-probs as the rollout statistics.** DS-GRPO, ProGRPO and the STILL perplexity shaping need the rollout
policy's log-probs. With vLLM's importance-sampling correction on (TRL's default) TRL runs its own no-grad pass for
`old_per_token_logps` and the methods reuse it (the trainer's own pi_old; `tests/test_vllm_inputs.py`). With the
correction off and on-policy training TRL computes no old log-probs; instead of one added forward, the methods then
take vLLM's per-token log-probs of the sampled tokens (`sampling_per_token_logps`). Those are the sampling policy's:
in colocate mode vLLM holds the weights synced at this step, which are pi_old itself (on-policy: the loss's old
log-probs are the current policy's, detached), so they differ from the trainer's recomputation only by the engines'
numerics (TRL logs that gap as `sampling/sampling_logp_difference/mean`, below 1e-2 in our CPU tests). This is the
same decision TRL itself makes when the correction is off: vLLM's samples are treated as on-policy. They are used
only when they are TRL's quantity: vLLM's `processed_logprobs` are taken after top-k/top-p/min-p and penalties, so
reuse needs `top_p == 1`, no top-k, `min_p == 0`, `repetition_penalty == 1` and no `generation_kwargs`; otherwise
the trainer's pass runs. ProGRPO's prompt log-probs come from vLLM's `prompt_logprobs` in colocate mode when the
temperature is 1 (vLLM scores prompt tokens at temperature 1, whatever the sampling temperature); otherwise one
forward over the unique prompts (not the completions) computes them.

**Shutdown.** vLLM (colocate) creates the default process group itself, and tears it down again at exit. The CLI's
end-of-training teardown (`accelerator.end_training()`) would destroy it first, and vLLM's exit-time cleanup then
prints `Exception ignored ... Invalid process group specified`. `close_vllm()` shuts vLLM down, in vLLM's order,
before that teardown.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from functools import cache

import torch

from .capture import Capture
from .vllm_engine import cpu_head_size_problem, shutdown_llm, vllm_runs_on_cpu

#: `generation_kwargs` keys whose presence does not change vLLM's log-probs (all others may).
_NEUTRAL_GENERATION_KWARGS = frozenset({"seed", "max_tokens", "stop", "stop_token_ids", "ignore_eos",
                                        "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output"})


def vllm_installed() -> bool:
    """Whether TRL finds a vLLM it can use (installed, in the versions TRL supports)."""
    from trl.import_utils import is_vllm_available

    return is_vllm_available()


def vllm_on_cpu(config) -> bool:
    """Whether this run generates with vLLM without a GPU: TRL's engine is then replaced by the CPU one
    (`cpu_generation_class`)."""
    return config is not None and getattr(config, "use_vllm", False) and not torch.cuda.is_available()


def check_cpu_head_size(config, model) -> None:
    """One-line error before TRL builds vLLM on a CPU for a model whose head size vLLM's CPU attention refuses."""
    if vllm_on_cpu(config) and config.vllm_mode == "colocate" and vllm_runs_on_cpu():
        if problem := cpu_head_size_problem(model):
            raise ValueError(f"use_vllm: {problem}; set use_vllm: false to generate with transformers")


@contextmanager
def trl_builds(cls):
    """While TRL's `GRPOTrainer.__init__` runs, make it build `cls` instead of its `VLLMGeneration` (None: TRL's).

    Relies on TRL 1.16's `GRPOTrainer.__init__` constructing the engine as `VLLMGeneration(...)`, the name imported
    into `trl.trainer.grpo_trainer` (pinned in `tests/test_trl_contract.py`). Scoped to that call: the name is TRL's
    again as soon as the trainer is built.
    """
    if cls is None:
        yield
        return
    import trl.trainer.grpo_trainer as grpo_module

    original = grpo_module.VLLMGeneration
    grpo_module.VLLMGeneration = cls
    try:
        yield
    finally:
        grpo_module.VLLMGeneration = original


# ----------------------------------------------------------------------------------- the CPU engine's weight sync
# `CPUVLLMGeneration` (`cpu_generation_class`, below) subclasses TRL's engine and calls these.
def server_without_nccl(engine) -> bool:
    return engine.mode == "server" and engine.accelerator.device.type != "cuda"


def connect_server(engine) -> None:
    """TRL's server branch of engine set-up, less `init_communicator` (NCCL only; it raises NotImplementedError off
    CUDA): the client, and one clear error when the server's development endpoints are off."""
    from trl.generation.vllm_client import VLLMClient

    if engine.accelerator.is_main_process:
        base_url = engine.server_base_url or f"http://{engine.server_host}:{engine.server_port}"
        engine.vllm_client = VLLMClient(base_url=base_url, group_port=engine.group_port,
                                        connection_timeout=engine.server_timeout)
        engine.vllm_client.get_server_info()
    engine.accelerator.wait_for_everyone()


def copied(params):
    """TRL's weight iterator (it gathers ZeRO-3/FSDP shards, merges a LoRA adapter and strips PEFT names), copied
    tensor by tensor: vLLM's layerwise reload may hold a tensor until its layer is complete, after the gather context
    that produced it has released it. Exhausted at the end, so TRL unmerges the adapter."""
    try:
        for name, tensor in params:
            yield name, tensor.detach().clone()
    finally:
        for _ in params:
            pass


def reload_colocated(engine, weights) -> None:
    runner = engine.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    engine.llm.reset_prefix_cache()


def reload_server_from_disk(engine, weights) -> None:
    """Write the weights to a safetensors folder and ask the server (same host) to reload them from it."""
    from safetensors.torch import save_file

    main = engine.accelerator.is_main_process
    tensors = {}
    for name, tensor in weights:  # every process iterates: gathering shards is a collective
        if main:
            tensors[name] = tensor.to("cpu").contiguous()
    if main:
        if engine._server_weights_dir is None:
            engine._server_weights_dir = tempfile.mkdtemp(prefix="exploration_trl_vllm_sync_")
        folder = engine._server_weights_dir
        save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        client = engine.vllm_client
        response = client.session.post(f"{client.base_url}/collective_rpc",
                                       json={"method": "reload_weights", "kwargs": {"weights_path": folder}})
        if response.status_code != 200:
            raise RuntimeError(f"the vLLM server at {client.base_url} could not reload the weights from {folder} "
                               f"({response.status_code}: {response.text[:200]}); it must run on this host with "
                               "VLLM_SERVER_DEV_MODE=1")
        client.reset_prefix_cache()
    engine.accelerator.wait_for_everyone()


def remove_weights_dir(engine) -> None:
    folder = engine._server_weights_dir
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        engine._server_weights_dir = None


class VLLMSupport:
    """The vLLM parts of one trainer (see the module docstring): vLLM's log-probs reused, and the shutdown."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.prompt_logprobs: dict[tuple[int, ...], list[float]] = {}  # the batch's, by prompt token ids
        if trainer.use_vllm:
            self.request_prompt_logprobs()

    def start_batch(self):
        """Forget the previous batch's prompt log-probs; this batch's `LLM.generate` calls (several with dynamic
        sampling) fill them again. The first step of `ExplorationGRPOTrainer._generate_and_score_completions`."""
        self.prompt_logprobs = {}

    def logps_are_trls(self) -> bool:
        """Whether vLLM's processed log-probs are TRL's `log_softmax(logits / temperature)` of the sampled token."""
        t = self.trainer
        extra = set(t.args.generation_kwargs or {}) - _NEUTRAL_GENERATION_KWARGS
        return (t.top_p == 1.0 and t.top_k in (None, 0, -1) and not t.min_p
                and t.repetition_penalty == 1.0 and not extra)

    def uses_logps(self) -> bool:
        t = self.trainer
        return (t.use_vllm and t._needs_rollout_logps() and not t._needs_rollout_candidates()
                and not t._trl_computes_old_logps() and self.logps_are_trls() and not t.tools
                and t.rollout_func is None and not t.is_vision_language())

    def request_prompt_logprobs(self):
        """Colocate, temperature 1: ask vLLM for the prompt tokens' log-probs and keep them from each `generate`.

        Wraps this trainer's `LLM.generate` (an instance attribute; vLLM's class is untouched) because TRL's
        `VLLMGeneration.generate` returns only the completions' log-probs.
        """
        t = self.trainer
        if not (self.uses_logps() and t._needs_prompt_logps() and t.vllm_mode == "colocate"
                and t.temperature == 1.0):
            return
        generation = t.vllm_generation
        generation.generation_kwargs = {**generation.generation_kwargs, "prompt_logprobs": 0}
        llm = generation.llm
        original = llm.generate

        def generate(*args, **kwargs):
            outputs = original(*args, **kwargs)
            for out in outputs:
                if out.prompt_logprobs is None:
                    continue
                ids = list(out.prompt_token_ids)
                values = [math.nan] + [entry[token].logprob for token, entry in zip(ids[1:], out.prompt_logprobs[1:],
                                                                                   strict=True)]
                self.prompt_logprobs[tuple(ids)] = values
            return outputs

        llm.generate = generate

    def capture_from_generation(self, output) -> Capture | None:
        """vLLM's own log-probs of the sampled tokens as the rollout statistics, when they are TRL's quantity."""
        if not self.uses_logps():
            return None
        logps = output.get("sampling_per_token_logps")
        if logps is None:
            return None
        mask = output["completion_mask"].bool()
        if torch.isnan(logps[mask]).any():  # a token vLLM could not score: recompute instead
            return None
        self.trainer.note_metric("vllm/rollout_logps_from_vllm", 1.0)
        return Capture(mode="rollout", logps=torch.where(mask, logps, torch.zeros_like(logps)))

    @torch.no_grad()
    def prompt_only_logps(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor | None:
        """The prompts' log-probs vLLM scored while generating (`request_prompt_logprobs`); None if one is missing."""
        recorded = self.prompt_logprobs
        rows = []
        for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist(), strict=True):
            real = tuple(t for t, m in zip(ids, mask, strict=True) if m)
            if real not in recorded:
                return None
            rows.append(recorded[real])
        width = prompt_ids.size(1)
        out = torch.zeros(len(rows), max(width - 1, 0), device=prompt_ids.device)
        for i, values in enumerate(rows):
            # Left-padded: the row's tokens fill the last len(values) positions; position p is predicted at p - 1.
            scored = torch.tensor(values[1:], dtype=out.dtype, device=out.device)
            if scored.numel():
                out[i, width - 1 - scored.numel():] = scored
        self.trainer.note_metric("vllm/prompt_logps_from_vllm", 1.0)
        return out

    # ------------------------------------------------------------------ shutdown
    def close(self):
        """Shut the colocated vLLM engine down (and its process group, which it created), before any other teardown.

        Safe to call twice, and a no-op without vLLM. The trainer cannot generate with vLLM afterwards.
        """
        t = self.trainer
        generation = getattr(t, "vllm_generation", None)
        if generation is None:
            return
        if hasattr(generation, "close"):
            generation.close()
        llm = getattr(generation, "llm", None)
        if llm is not None:
            generation.llm = None
            shutdown_llm(llm)
        t.vllm_generation = None


# ---------------------------------------------------------------------------------------------- vLLM on a CPU
@cache
def cpu_generation_class():
    """`CPUVLLMGeneration`, TRL's `VLLMGeneration` with the CPU weight syncs (defined lazily: it subclasses TRL's)."""
    from trl.generation.vllm_generation import VLLMGeneration

    return _define_cpu_class(VLLMGeneration)


def _define_cpu_class(base):
    class CPUVLLMGeneration(base):
        """TRL's `VLLMGeneration`, syncing weights through vLLM's reload API when vLLM runs on the CPU
        (`vllm_support.py` says why and holds the steps)."""

        _server_weights_dir: str | None = None  # the folder server mode reloads from (removed by `close`)

        def _init_vllm(self):
            # Relies on TRL 1.16's server branch of `_init_vllm` being a `VLLMClient` plus `init_communicator`.
            if not server_without_nccl(self):
                return super()._init_vllm()
            connect_server(self)

        def sync_weights(self):
            if self.mode == "colocate" and vllm_runs_on_cpu():
                if self.enable_sleep_mode:  # as TRL does before loading
                    self.llm.wake_up(tags=["weights"])
                    self._llm_weights_sleeping = False
                reload_colocated(self, copied(self._iter_named_params()))
            elif server_without_nccl(self):
                reload_server_from_disk(self, copied(self._iter_named_params()))
            else:
                super().sync_weights()

        def close(self):
            remove_weights_dir(self)

    return CPUVLLMGeneration

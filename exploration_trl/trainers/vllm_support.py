"""vLLM in the trainers: a weight sync vLLM's CPU backend accepts, vLLM's own log-probs reused for the methods'
rollout statistics, and a clean shutdown (`VLLMMixin`, mixed into `ExplorationGRPOTrainer`).

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

import torch

from ..vllm_engine import cpu_head_size_problem, shutdown_llm, vllm_runs_on_cpu
from .capture import _Capture

#: `generation_kwargs` keys whose presence does not change vLLM's log-probs (all others may).
_NEUTRAL_GENERATION_KWARGS = frozenset({"seed", "max_tokens", "stop", "stop_token_ids", "ignore_eos",
                                        "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output"})


def _trl_vllm_generation():
    from trl.generation.vllm_generation import VLLMGeneration

    return VLLMGeneration


def cpu_generation_class():
    """`CPUVLLMGeneration`, TRL's `VLLMGeneration` with the CPU weight syncs (defined lazily: it subclasses TRL's)."""
    global _CPU_CLASS
    if _CPU_CLASS is None:
        _CPU_CLASS = _define_cpu_class(_trl_vllm_generation())
    return _CPU_CLASS


_CPU_CLASS = None


def _define_cpu_class(base):
    class CPUVLLMGeneration(base):
        """TRL's `VLLMGeneration`, syncing weights through vLLM's reload API when vLLM runs on the CPU."""

        _server_weights_dir: str | None = None

        def _server_without_nccl(self) -> bool:
            return self.mode == "server" and self.accelerator.device.type != "cuda"

        def _init_vllm(self):
            if not self._server_without_nccl():
                return super()._init_vllm()
            # TRL's server branch, less `init_communicator` (NCCL only; it raises NotImplementedError off CUDA).
            from trl.generation.vllm_client import VLLMClient

            if self.accelerator.is_main_process:
                base_url = self.server_base_url or f"http://{self.server_host}:{self.server_port}"
                self.vllm_client = VLLMClient(base_url=base_url, group_port=self.group_port,
                                              connection_timeout=self.server_timeout)
                self.vllm_client.get_server_info()  # one clear error when the development endpoints are off
            self.accelerator.wait_for_everyone()

        def sync_weights(self):
            if self.mode == "colocate" and vllm_runs_on_cpu():
                self._reload_colocated()
            elif self._server_without_nccl():
                self._reload_server_from_disk()
            else:
                super().sync_weights()

        def _weights(self):
            """TRL's own iterator (gathers ZeRO-3/FSDP shards, merges a LoRA adapter and strips PEFT names), copied
            tensor by tensor: vLLM's layerwise reload may hold a tensor until its layer is complete, after the gather
            context that produced it has released it. Exhausted at the end, so TRL unmerges the adapter."""
            params = self._iter_named_params()
            try:
                for name, tensor in params:
                    yield name, tensor.detach().clone()
            finally:
                for _ in params:
                    pass

        def _reload_colocated(self):
            if self.enable_sleep_mode:  # as TRL does before loading
                self.llm.wake_up(tags=["weights"])
                self._llm_weights_sleeping = False
            runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
            runner.reload_weights(weights_iterator=self._weights(), is_checkpoint_format=True)
            self.llm.reset_prefix_cache()

        def _reload_server_from_disk(self):
            from safetensors.torch import save_file

            main = self.accelerator.is_main_process
            tensors = {}
            for name, tensor in self._weights():  # every process iterates: gathering shards is a collective
                if main:
                    tensors[name] = tensor.to("cpu").contiguous()
            if main:
                if self._server_weights_dir is None:
                    self._server_weights_dir = tempfile.mkdtemp(prefix="exploration_trl_vllm_sync_")
                save_file(tensors, os.path.join(self._server_weights_dir, "model.safetensors"), metadata={"format": "pt"})
                client = self.vllm_client
                response = client.session.post(
                    f"{client.base_url}/collective_rpc",
                    json={"method": "reload_weights", "kwargs": {"weights_path": self._server_weights_dir}},
                )
                if response.status_code != 200:
                    raise RuntimeError(f"the vLLM server at {client.base_url} could not reload the weights from "
                                       f"{self._server_weights_dir} ({response.status_code}: {response.text[:200]}); "
                                       "it must run on this host with VLLM_SERVER_DEV_MODE=1")
                client.reset_prefix_cache()
            self.accelerator.wait_for_everyone()

        def close(self):
            if self._server_weights_dir is not None:
                shutil.rmtree(self._server_weights_dir, ignore_errors=True)
                self._server_weights_dir = None

    return CPUVLLMGeneration


@contextmanager
def _trl_builds(cls):
    """While TRL's `GRPOTrainer.__init__` runs, make it build `cls` instead of its `VLLMGeneration`.

    Relies on TRL 1.16's `GRPOTrainer.__init__` constructing the engine as `VLLMGeneration(...)`, the name imported
    into `trl.trainer.grpo_trainer` (pinned in `tests/test_trl_contract.py`).
    """
    import trl.trainer.grpo_trainer as grpo_module

    original = grpo_module.VLLMGeneration
    grpo_module.VLLMGeneration = cls
    try:
        yield
    finally:
        grpo_module.VLLMGeneration = original


def _config_of(args, kwargs):
    config = kwargs.get("args")
    if config is None and len(args) > 2:
        config = args[2]
    return config


class VLLMMixin:
    """The vLLM parts of `ExplorationGRPOTrainer` (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        config = _config_of(args, kwargs)
        on_cpu = (config is not None and getattr(config, "use_vllm", False) and not torch.cuda.is_available())
        self._vllm_prompt_logprobs: dict[tuple[int, ...], list[float]] = {}
        if on_cpu and config.vllm_mode == "colocate" and vllm_runs_on_cpu():
            model = kwargs.get("model", args[0] if args else None)
            if problem := cpu_head_size_problem(model):
                raise ValueError(f"use_vllm: {problem}; set use_vllm: false to generate with transformers")
        if on_cpu:
            with _trl_builds(cpu_generation_class()):
                super().__init__(*args, **kwargs)
        else:
            super().__init__(*args, **kwargs)
        if self.use_vllm:
            self._request_vllm_prompt_logprobs()

    # ------------------------------------------------------------------ vLLM's log-probs
    def _start_vllm_batch(self):
        """Forget the previous batch's prompt log-probs; this batch's `LLM.generate` calls (several with dynamic
        sampling) fill them again. The first step of `ExplorationGRPOTrainer._generate_and_score_completions`."""
        self._vllm_prompt_logprobs = {}

    def _vllm_logps_are_trls(self) -> bool:
        """Whether vLLM's processed log-probs are TRL's `log_softmax(logits / temperature)` of the sampled token."""
        args = self.args
        extra = set(args.generation_kwargs or {}) - _NEUTRAL_GENERATION_KWARGS
        return (self.top_p == 1.0 and self.top_k in (None, 0, -1) and not self.min_p
                and self.repetition_penalty == 1.0 and not extra)

    def _uses_vllm_logps(self) -> bool:
        return (self.use_vllm and self._needs_rollout_logps() and not self._needs_rollout_candidates()
                and not self._trl_computes_old_logps() and self._vllm_logps_are_trls() and not self.tools
                and self.rollout_func is None and not self._is_vlm)

    def _request_vllm_prompt_logprobs(self):
        """Colocate, temperature 1: ask vLLM for the prompt tokens' log-probs and keep them from each `generate`.

        Wraps this trainer's `LLM.generate` (an instance attribute; vLLM's class is untouched) because TRL's
        `VLLMGeneration.generate` returns only the completions' log-probs.
        """
        if not (self._uses_vllm_logps() and self._needs_prompt_logps() and self.vllm_mode == "colocate"
                and self.temperature == 1.0):
            return
        generation = self.vllm_generation
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
                self._vllm_prompt_logprobs[tuple(ids)] = values
            return outputs

        llm.generate = generate

    def _capture_from_generation(self, output) -> _Capture | None:
        capture = super()._capture_from_generation(output)
        if capture is not None or not self._uses_vllm_logps():
            return capture
        logps = output.get("sampling_per_token_logps")
        if logps is None:
            return None
        mask = output["completion_mask"].bool()
        if torch.isnan(logps[mask]).any():  # a token vLLM could not score: recompute instead
            return None
        self._count_vllm_logps_reuse()
        return _Capture(mode="rollout", logps=torch.where(mask, logps, torch.zeros_like(logps)))

    def _count_vllm_logps_reuse(self):
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["vllm/rollout_logps_from_vllm"].append(1.0)

    @torch.no_grad()
    def _prompt_only_logps(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        recorded = self._vllm_prompt_logprobs
        rows = []
        for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist(), strict=True):
            real = tuple(t for t, m in zip(ids, mask, strict=True) if m)
            if real not in recorded:
                return super()._prompt_only_logps(prompt_ids, prompt_mask)
            rows.append(recorded[real])
        width = prompt_ids.size(1)
        out = torch.zeros(len(rows), max(width - 1, 0), device=prompt_ids.device)
        for i, values in enumerate(rows):
            # Left-padded: the row's tokens fill the last len(values) positions; position p is predicted at p - 1.
            scored = torch.tensor(values[1:], dtype=out.dtype, device=out.device)
            if scored.numel():
                out[i, width - 1 - scored.numel():] = scored
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["vllm/prompt_logps_from_vllm"].append(1.0)
        return out

    # ------------------------------------------------------------------ shutdown
    def close_vllm(self):
        """Shut the colocated vLLM engine down (and its process group, which it created), before any other teardown.

        Safe to call twice, and a no-op without vLLM. The trainer cannot generate with vLLM afterwards.
        """
        generation = getattr(self, "vllm_generation", None)
        if generation is None:
            return
        if hasattr(generation, "close"):
            generation.close()
        llm = getattr(generation, "llm", None)
        if llm is not None:
            generation.llm = None
            shutdown_llm(llm)
        self.vllm_generation = None

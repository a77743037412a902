"""`ExplorationGRPOTrainer`: TRL's `GRPOTrainer` plus the plumbing every exploration method shares.

What it adds, without forking any TRL method:

* **The advantage hook** `_compute_advantages(batch)`, called once per generation batch after TRL has
  scored the completions. `batch` is a `RolloutBatch`: the rewards gathered across processes, the group
  layout, TRL's GRPO advantages and, when a method asks, the rollout policy's per-token log-probs and
  entropies (and prompt-token log-probs). The STILL shapers run after it.
* **Rollout statistics from passes TRL already runs.** The old-log-prob pass TRL runs off-policy (or
  under vLLM) is reused: entropies are switched on and the backbone's hidden states are captured with a
  forward hook. Only when TRL runs no such pass and a method needs one is a single no-grad pass added.
* **Loss hooks** that reuse TRL's `_compute_loss`: `_transform_policy_logps` changes the per-token
  importance ratio (TRL forms it as `exp(per_token_logps - old_per_token_logps)`), and
  `_extra_per_token_loss` adds per-token terms aggregated exactly as TRL's `loss_type` aggregates.
* **Exploration metrics** logged with TRL's own metrics (entropy on correct vs wrong completions,
  Λ(1..3), Λ(sample), branching factor, unique completions per group, pass@G).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from accelerate.utils import is_peft_model
from torch.distributed.tensor import DTensor
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import maybe_gather_lm_head_ctx

from ..core import advantages as core_adv
from ..errors import HookDidNotRunError, NoRewardError
from ..ops.lm_head import token_statistics
from ..rewards._base import DEFAULT_CORRECT_THRESHOLD, is_correct
from ._collectives import gather_rows
from ._generation_logps import GenerationLogps, padded


#: transformers 5 renamed gradient checkpointing to activation checkpointing; TRL 1.16's rollout helpers
#: (`disable_gradient_checkpointing`, `unwrap_model_for_generation`) still call the old names on every rollout,
#: whatever the config says. Only these three messages, from transformers' model code, are filtered.
_TRL_ROLLOUT_DEPRECATIONS = r"`(is_gradient_checkpointing|gradient_checkpointing_(enable|disable))` is deprecated"


@dataclass
class ExplorationGRPOConfig(GRPOConfig):
    """`GRPOConfig` plus the STILL advantage shapers and exploration-metric switches.

    With the defaults below (shapers off) training is exactly TRL's GRPO. Paper values: STILL report
    (Sec. 3, Eq. 11/12) uses `ppl_shaping_alpha=0.01` and `position_bonus_gamma=0.1`, the position bonus switched
    on at step 200 for 100 steps (the defaults of `position_bonus_start_step` / `position_bonus_num_steps`).
    """

    ppl_shaping_alpha: float = field(
        default=0.0,
        metadata={"help": "STILL perplexity shaping: A * (1 - alpha * w_ppl) (Eq. 11). 0 disables; paper: 0.01."},
    )
    position_bonus_gamma: float = field(
        default=0.0,
        metadata={"help": "STILL position bonus: A_t + sign(A) * gamma * sigmoid(...) (Eq. 12). 0 disables; paper: 0.1."},
    )
    position_bonus_start_step: int = field(
        default=200,
        metadata={"help": "First global step at which the position bonus is applied (STILL report: step 200, once "
                  "the policy has learnt the task format)."},
    )
    position_bonus_num_steps: int | None = field(
        default=100,
        metadata={"help": "Number of steps the position bonus stays on (STILL report: 100; None: until the end)."},
    )
    correct_reward_threshold: float = field(
        default=DEFAULT_CORRECT_THRESHOLD,
        metadata={"help": "A completion is correct when its total (weighted) reward is above this (metrics, DS-GRPO, "
                  "ProGRPO's all_wrong/keep_sign; `exploration_trl.rewards.is_correct`). Raise it above any partial "
                  "credit, e.g. 0.5 with a 0.1 format bonus."},
    )
    rollout_logps_from_generation: bool = field(
        default=True,
        metadata={"help": "When TRL computes no old log-probs (fully on-policy, transformers generation), read the "
                  "rollout log-probs ProGRPO, DS-GRPO and STILL shaping need from the logits generation already "
                  "computed, instead of one more forward pass over every completion. false: recompute them."},
    )
    exploration_metrics: bool = field(
        default=True, metadata={"help": "Log exploration metrics (entropy by correctness, Λ(n), branching, pass@G)."}
    )
    exploration_metrics_max_tokens: int = field(
        default=64,
        metadata={"help": "Completion tokens per micro-batch sampled for Λ(n) and the branching factor."},
    )
    exploration_metrics_top_p: float = field(
        default=0.95, metadata={"help": "Top-p mass for the rollout branching factor (STILL Sec. 2.2)."}
    )
    debug_rollout_dir: str | None = field(
        default=None,
        metadata={"help": "Debugging: save each generation batch's rewards and advantages per process as .pt files."},
    )

    # TRL turns checkpointing on through `gradient_checkpointing`, which transformers 5 deprecates (a FutureWarning
    # at every start); the same default is set here through the current name, `activation_checkpointing`.
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing (transformers 5)."}
    )
    activation_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Recompute activations in the backward pass to save memory (default: on, as TRL's GRPO)."},
    )

    def __post_init__(self):
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True  # TRL's default, under the name transformers 5 reads
        if not self.use_cpu and not has_accelerator():
            # No GPU: train on the CPU (in float32 unless bf16 was asked for) instead of stopping at transformers'
            # "Your setup doesn't support bf16/gpu".
            self.use_cpu = True
            self.bf16 = False if self.bf16 is None else self.bf16
        check_non_negative(self, {
            "learning_rate": "a step size (e.g. 1e-6)",
            "epsilon": "the lower clip range of the ratio (TRL: 0.2)",
            "epsilon_high": "the upper clip range of the ratio",
            "ppl_shaping_alpha": "the weight of STILL's perplexity shaping (paper: 0.01; 0 switches it off)",
            "position_bonus_gamma": "the weight of STILL's position bonus (paper: 0.1; 0 switches it off)",
        })
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature is {self.temperature} but must be > 0: GRPO learns from sampled completions "
                             "(TRL's default: 1.0)")
        super().__post_init__()
        if self.position_bonus_num_steps is not None and self.position_bonus_num_steps < 0:
            raise ValueError(f"position_bonus_num_steps must be >= 0 or None, got {self.position_bonus_num_steps}")
        if not 0.0 < self.exploration_metrics_top_p <= 1.0:
            raise ValueError(f"exploration_metrics_top_p must be in (0, 1], got {self.exploration_metrics_top_p}")


def has_accelerator() -> bool:
    """True when torch sees a GPU (CUDA, ROCm, Apple MPS) or an Intel XPU."""
    xpu = getattr(torch, "xpu", None)
    return bool(torch.cuda.is_available() or torch.backends.mps.is_available() or (xpu and xpu.is_available()))


def check_non_negative(config, meanings: dict[str, str]):
    """Raise a one-line `ValueError` naming the first of `meanings`' keys whose value is negative (None is unset)."""
    for name, meaning in meanings.items():
        value = getattr(config, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"{name} is {value} but must be >= 0: it is {meaning}")


@dataclass
class RolloutBatch:
    """What `_compute_advantages` sees for one generation batch.

    Global tensors cover every process (`B_global` rows, groups of `num_generations` contiguous rows);
    `process_slice` selects this process's rows. Per-token tensors are local (`B_local, T`).
    """

    rewards: torch.Tensor
    rewards_per_func: torch.Tensor
    advantages: torch.Tensor
    num_generations: int
    process_slice: slice
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    num_processes: int
    global_step: int
    completion_logps: torch.Tensor | None = None
    completion_entropies: torch.Tensor | None = None
    prompt_logps: torch.Tensor | None = None
    prompt_logps_mask: torch.Tensor | None = None

    @property
    def local_rewards(self) -> torch.Tensor:
        return self.rewards[self.process_slice]

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of every process, in process order (floats as float32): `(B_local, ...)` -> `(B_global, ...)`."""
        return gather_rows(x, self.num_processes)

    def gather_padded(self, x: torch.Tensor, pad_value: float = 0.0, pad_side: str = "right") -> torch.Tensor:
        """Gather a local `(B_local, T)` tensor whose `T` differs across processes, padding to the longest.

        Completion tensors are right-padded (`pad_side="right"`); prompt tensors are left-padded, so gather them
        with `pad_side="left"` to keep their last token aligned.
        """
        return gather_rows(x, self.num_processes, pad_dim=1, pad_value=pad_value, pad_side=pad_side)


@dataclass
class _Capture:
    """Records what one `_get_per_token_logps_and_entropies` call computed (see `_capturing`)."""

    mode: str  # "rollout" or "loss"
    logps: torch.Tensor | None = None
    entropies: torch.Tensor | None = None
    hidden: torch.Tensor | None = None  # (B, L, H) last hidden states of the backbone
    input_ids: torch.Tensor | None = None
    logits_to_keep: int = 0

    @property
    def done(self) -> bool:
        return self.logps is not None

    def completion_hidden(self) -> torch.Tensor:
        # TRL's fused head scores label t with hidden state t-1; completions are the last `logits_to_keep` labels.
        return self.hidden[:, -self.logits_to_keep - 1 : -1]


class ExplorationGRPOTrainer(GRPOTrainer):
    """TRL `GRPOTrainer` with the exploration hooks. With no method active it trains exactly like TRL."""

    _tag_names = ["trl", "grpo", "exploration-trl", "rlvr"]
    config_class = ExplorationGRPOConfig
    method_name = "grpo"

    def __init__(self, *args, **kwargs):
        warnings.filterwarnings("ignore", message=_TRL_ROLLOUT_DEPRECATIONS, category=FutureWarning,
                                module="transformers.modeling_utils")
        super().__init__(*args, **kwargs)
        self._capture: _Capture | None = None
        self._loss_state: dict = {}
        self._ran_hooks: set[str] = set()  # hooks that acted on the current step (see `_check_hooks_ran`)
        self._metrics_generator = torch.Generator().manual_seed(int(self.args.seed))

    # ------------------------------------------------------------------ what methods need
    def _needs_rollout_logps(self) -> bool:
        """True when `_compute_advantages` needs the rollout policy's completion log-probs and entropies."""
        return self.args.ppl_shaping_alpha != 0.0

    def _needs_prompt_logps(self) -> bool:
        """True when `_compute_advantages` needs log p(q_t | q_<t) of the prompt tokens."""
        return False

    def _needs_loss_capture(self) -> bool:
        """True when the loss pass must keep the backbone's hidden states (loss hooks or metrics)."""
        return self.args.exploration_metrics

    def _trl_computes_old_logps(self) -> bool:
        """Mirror of TRL 1.16's condition for computing `old_per_token_logps` in `_generate_and_score_completions`.
        `tests/test_trl_contract.py` checks it against what TRL actually returns."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return self.args.gradient_accumulation_steps % generate_every != 0 or (
            self.use_vllm and self.vllm_importance_sampling_correction
        )

    def _updates_per_rollout(self) -> float:
        """Optimizer updates each generation batch feeds; 1 means fully on-policy (old log-probs == current)."""
        return self.args.steps_per_generation * self.num_iterations / self.args.gradient_accumulation_steps

    # ------------------------------------------------------------------ capture plumbing
    def _lm_head(self, model):
        """`(hf_model, lm_head)` under any accelerate/PEFT wrapping; cached, as `is_peft_model` costs ~10 ms a call."""
        cached = getattr(self, "_lm_head_cache", None)
        if cached is not None and cached[0] is model:
            return cached[1], cached[2]
        base = self.accelerator.unwrap_model(model)
        if is_peft_model(base):
            base = base.get_base_model()
        self._lm_head_cache = (model, base, base.get_output_embeddings())
        return base, self._lm_head_cache[2]

    def _is_policy(self, model) -> bool:
        """True when `model` is the policy under any wrapper (DDP, DeepSpeed engine, FSDP, PEFT), not the reference.

        TRL calls `_get_per_token_logps_and_entropies` with `self.model` in the rollout pass but with the *wrapped*
        model (`self.model_wrapped`: the DDP module, the DeepSpeed engine) in the loss pass.
        """
        if model is self.model or model is self.model_wrapped:
            return True
        if self.ref_model is not None and model is self.ref_model:
            return False
        return self.accelerator.unwrap_model(model) is self.accelerator.unwrap_model(self.model)

    @contextmanager
    def _lm_head_weights(self):
        """Yield `(weight, bias, regather)`: the LM head's full parameters for a direct projection, under any sharding.

        ZeRO-3 keeps the head partitioned outside its module's forward, so it is gathered for the duration with
        TRL's `maybe_gather_lm_head_ctx` (`regather` re-enters that context, for a custom backward that recomputes
        with the weight). FSDP2 holds DTensors: `full_tensor()` all-gathers with autograd, so gradients reach the
        shards. Gathering is a collective: every process must enter this context the same number of times, so
        callers enter it even when they have no rows to project.
        """
        _, head = self._lm_head(self.model)
        weight, bias = head.weight, head.bias
        if isinstance(weight, DTensor):
            weight = weight.full_tensor()
            bias = bias.full_tensor() if isinstance(bias, DTensor) else bias
            regather = nullcontext
        else:
            def regather():
                return maybe_gather_lm_head_ctx(head.weight, head.bias)
        with regather():
            yield weight, bias, regather

    @contextmanager
    def _capturing(self, model, capture: _Capture):
        """Keep the backbone's last hidden states during TRL's fused-head forward.

        Relies on TRL 1.16's `add_fused_lm_head`, whose forward calls the backbone (`model.base_model`) as a
        module and projects its `last_hidden_state`; a forward hook on that module sees the same tensor (with
        its autograd graph in the loss pass). `tests/test_trl_contract.py` fails if that stops being true.
        """
        base, _ = self._lm_head(model)
        chunks: list[torch.Tensor] = []

        def hook(_module, _args, output):
            chunks.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

        handle = base.base_model.register_forward_hook(hook)
        try:
            yield chunks
        finally:
            handle.remove()

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, **kwargs
    ):
        capture = self._capture
        if capture is None or capture.done or not self._is_policy(model):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, **kwargs
            )
        with self._capturing(model, capture) as chunks:
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, True, **kwargs
            )
        capture.logps, capture.entropies = logps, entropies
        capture.hidden = torch.cat(chunks, dim=0) if len(chunks) > 1 else chunks[0]
        capture.input_ids, capture.logits_to_keep = input_ids, logits_to_keep
        if capture.mode == "loss":
            logps = self._transform_policy_logps(logps, capture, self._loss_inputs, self._loss_state)
        return logps, (entropies if compute_entropy else None), aux

    # ------------------------------------------------------------------ rollout side
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # TRL returns the rewards of every process (gathered); keep them for the advantage hook.
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func
        self._check_some_reward(rewards_per_func)
        self._log_reward_failures()
        return rewards_per_func

    def _check_some_reward(self, rewards_per_func: torch.Tensor):
        """No silent no-op when no reward scores anything (every value None/NaN: TRL then trains on zero advantages).

        On the first batches this is a setup mistake, so training stops; after rewards were seen, a batch without
        any is warned about once. `rewards_per_func` is gathered across processes, so every process decides alike.
        """
        if not bool(torch.isnan(rewards_per_func).all()):
            self._some_reward_seen = True
            return
        names = ", ".join(self.reward_func_names)
        if not getattr(self, "_some_reward_seen", False):
            raise NoRewardError(
                f"no reward scored any completion: every reward ({names}) returned None for every completion of the "
                "first batch; check that the dataset has the columns the rewards read (e.g. `answer` for "
                "math_accuracy) and that its reference answers parse"
            )
        if not getattr(self, "_warned_no_reward", False):
            self._warned_no_reward = True
            warnings.warn(f"no reward scored any completion of a generation batch at step {self.state.global_step} "
                          f"(every reward of {names} returned None); that batch taught nothing. Warned once.",
                          UserWarning, stacklevel=2)

    def _log_reward_failures(self):
        from ..rewards import pop_failure_counts

        counts = pop_failure_counts()
        local = torch.tensor(
            [float(counts.get(name, 0)) for name in self.reward_func_names], device=self.accelerator.device
        )
        total = self.accelerator.reduce(local, reduction="sum")
        mode = "train" if self.model.training else "eval"
        for name, value in zip(self.reward_func_names, total.tolist(), strict=True):
            self._metrics[mode][f"rewards/{name}/failures"].append(value)

    def _generate_and_score_completions(self, inputs):
        self._rollout_inputs = inputs  # the local rows (prompts, dataset columns), for hooks that need them
        self._generation_logps = None
        need_rollout = self._needs_rollout_logps() or self._needs_prompt_logps() or self._needs_rollout_candidates()
        self._capture = _Capture(mode="rollout") if need_rollout else None
        try:
            output = super()._generate_and_score_completions(inputs)
            capture = self._capture
            # TRL's own old-log-prob pass is reused only if it is the one we captured (same tensor object); else the
            # generation's own log-probs, else one added pass.
            if need_rollout and (not capture.done or capture.logps is not output.get("old_per_token_logps")):
                capture = self._capture_from_generation(output) or self._rollout_pass(output)
                if not capture.done:
                    raise HookDidNotRunError(
                        f"{self.method_name}: the rollout statistics it needs (log-probs, hidden states) were not "
                        "captured on this step (`_get_per_token_logps_and_entropies` did not see the policy model); "
                        "stopping rather than silently training something else. Please report this with your TRL "
                        "version and launcher."
                    )
        finally:
            self._capture = None

        batch = self._build_rollout_batch(output, capture if need_rollout else None)
        self._ran_hooks = set()
        advantages = self._compute_advantages(batch)
        self._check_hooks_ran("advantage", "`_compute_advantages` did not reach the method's override")
        advantages = self._apply_still_shapers(advantages, batch)
        output["advantages"] = advantages
        self._replace_logged_advantages(advantages, batch)
        if self.args.debug_rollout_dir:
            self._dump_rollout(batch, advantages)
        output.update(self._rollout_extras(batch, capture if need_rollout else None))
        return output

    def _dump_rollout(self, batch: RolloutBatch, advantages: torch.Tensor):
        """Save what the advantage hook saw and returned, one file per process and generation batch."""
        import os

        os.makedirs(self.args.debug_rollout_dir, exist_ok=True)
        self._dump_count = getattr(self, "_dump_count", 0) + 1
        keep = ("rewards", "advantages", "completion_ids", "completion_mask", "completion_logps", "prompt_ids",
                "prompt_mask", "prompt_logps", "prompt_logps_mask")
        payload = {k: getattr(batch, k) for k in keep}
        payload.update(final_advantages=advantages, num_generations=batch.num_generations,
                       process_index=self.accelerator.process_index)
        payload = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in payload.items()}
        name = f"rollout{self._dump_count:04d}_rank{self.accelerator.process_index}.pt"
        torch.save(payload, os.path.join(self.args.debug_rollout_dir, name))

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # Relies on TRL 1.16 calling the model's `generate` (transformers path) inside this method, once per batch.
        recorder = GenerationLogps(self.temperature) if self._records_generation_logps() else None
        with recorder.attached(self._lm_head(self.model)[0]) if recorder else nullcontext():
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        if recorder is not None:
            self._generation_logps = recorder.per_row(completion_ids)
        return completion_ids, logprobs

    def _records_generation_logps(self) -> bool:
        """Whether this rollout's log-probs can come from generation (see `_generation_logps`)."""
        return (
            self.args.rollout_logps_from_generation and self._capture is not None and self._needs_rollout_logps()
            and not self._needs_rollout_candidates() and not self._trl_computes_old_logps() and not self.use_vllm
            and not self.use_transformers_continuous_batching and not self.tools and not self._is_vlm
            and self.environment_factories is None and self.rollout_func is None
        )

    def _capture_from_generation(self, output) -> _Capture | None:
        """The rollout capture built from generation's log-probs, when they match TRL's completions."""
        rows = self._generation_logps
        self._generation_logps = None
        if rows is None:
            return None
        lengths = output["completion_mask"].sum(dim=1).tolist()
        if [r.numel() for r in rows] != [int(n) for n in lengths]:  # e.g. TRL post-processed the completions
            return None
        logps = padded(rows, output["completion_ids"].size(1), output["completion_ids"].device)
        return _Capture(mode="rollout", logps=logps)

    def _rollout_pass(self, output) -> _Capture:
        """The one added no-grad pass, run only when a method needs rollout statistics TRL did not compute."""
        capture = _Capture(mode="rollout")
        self._capture = capture
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        mode = "train" if self.model.training else "eval"
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        mm_keys = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                   "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")
        with torch.no_grad():
            self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, output["completion_ids"].size(1), batch_size=batch_size,
                compute_entropy=True, **{k: output[k] for k in mm_keys if k in output},
            )
        return capture

    def _gather(self, x: torch.Tensor, pad_dim: int | None = None, pad_value: float = 0.0,
                pad_side: str = "right") -> torch.Tensor:
        return gather_rows(x, self.accelerator.num_processes, pad_dim, pad_value, pad_side)

    def _build_rollout_batch(self, output, capture: _Capture | None) -> RolloutBatch:
        rewards_per_func = self._last_rewards_per_func
        weights = self.reward_weights.to(rewards_per_func.device)
        # Same aggregation as TRL: weighted nansum, NaN when every reward function returned None.
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        n_local = output["completion_ids"].size(0)
        rank = self.accelerator.process_index
        mode = "train" if self.model.training else "eval"
        batch = RolloutBatch(
            rewards=rewards,
            rewards_per_func=rewards_per_func,
            advantages=output["advantages"],
            num_generations=self.num_generations if mode == "train" else self.num_generations_eval,
            process_slice=slice(rank * n_local, (rank + 1) * n_local),
            prompt_ids=output["prompt_ids"],
            prompt_mask=output["prompt_mask"],
            completion_ids=output["completion_ids"],
            completion_mask=output["completion_mask"],
            num_processes=self.accelerator.num_processes,
            global_step=self.state.global_step,
        )
        if capture is not None:
            batch.completion_logps = capture.logps
            batch.completion_entropies = capture.entropies
            if self._needs_prompt_logps():
                batch.prompt_logps, batch.prompt_logps_mask = self._prompt_logps(capture, output)
        self._log_rollout_metrics(batch)
        return batch

    @torch.no_grad()
    def _prompt_logps(self, capture: _Capture, output) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(q_t | q_<t) for prompt tokens, computed once per unique prompt and shared by its rows.

        The first real prompt token has no context, so it is masked out (SPEC: the caller masks it).
        """
        prompt_ids, prompt_mask = output["prompt_ids"], output["prompt_mask"]
        n, plen = prompt_ids.shape
        # Rows of one prompt are contiguous (TRL's RepeatSampler); keep the first row of each run.
        same_as_prev = torch.zeros(n, dtype=torch.bool, device=prompt_ids.device)
        same_as_prev[1:] = (prompt_ids[1:] == prompt_ids[:-1]).all(dim=1) & (prompt_mask[1:] == prompt_mask[:-1]).all(dim=1)
        owners = torch.cumsum(~same_as_prev, 0) - 1  # index among unique prompts for each row
        unique_rows = (~same_as_prev).nonzero(as_tuple=True)[0]

        logps = torch.zeros(n, plen, device=prompt_ids.device)
        if capture.hidden is None:  # rollout log-probs came from generation: one pass over the unique prompts
            unique_logps = self._prompt_only_logps(prompt_ids[unique_rows], prompt_mask[unique_rows])
        else:
            hidden = capture.hidden[unique_rows, : max(plen - 1, 0)]  # predicts prompt tokens 1..plen-1
            targets = prompt_ids[unique_rows, 1:]
            with self._lm_head_weights() as (weight, bias, _):  # entered on every process: it may gather
                stats = token_statistics(
                    hidden.reshape(-1, hidden.size(-1)), weight, bias, targets.reshape(-1),
                    temperature=self.temperature, top_n=1, entropy=False,
                )
            unique_logps = stats["target_logps"].view(len(unique_rows), max(plen - 1, 0))
        if plen > 1:
            logps[:, 1:] = unique_logps[owners]
        mask = prompt_mask.clone()
        first_valid = prompt_mask.float().argmax(dim=1)
        mask[torch.arange(n, device=mask.device), first_valid] = 0
        return logps, mask

    @torch.no_grad()
    def _prompt_only_logps(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """`(U, P - 1)`: log p(q_t | q_<t), t >= 1, from one no-grad forward over the prompts alone.

        A single forward whatever the number of rows (`batch_size` = all of them), so that every process runs the
        same number of forwards under ZeRO-3/FSDP, where each forward gathers parameters.
        """
        keep = max(prompt_ids.size(1) - 1, 1)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            self.model, prompt_ids, prompt_mask, keep, batch_size=prompt_ids.size(0)
        )
        return logps[:, -(prompt_ids.size(1) - 1):] if prompt_ids.size(1) > 1 else logps[:, :0]

    def _compute_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """Return this process's advantages, `(B_local,)` or `(B_local, T)`.

        The base returns TRL's GRPO advantages unchanged. Methods override this, call `super()`, and
        transform the result with `exploration_trl.core` functions.
        """
        return batch.advantages

    def _apply_still_shapers(self, advantages: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """STILL report shapers, applied after the advantage-side method: perplexity (Eq. 11), then position (Eq. 12)."""
        args = self.args
        if args.ppl_shaping_alpha != 0.0:
            logps = batch.gather_padded(batch.completion_logps)
            mask = batch.gather_padded(batch.completion_mask)
            per_token = advantages.dim() == 2  # e.g. DS-GRPO's token granularity: scale every token of a row
            global_adv = batch.gather_padded(advantages) if per_token else batch.gather(advantages)
            shaped = core_adv.ppl_shaped_advantages(
                global_adv, logps, mask, batch.num_generations, alpha=args.ppl_shaping_alpha
            )
            advantages = shaped[batch.process_slice]
            if per_token:
                advantages = advantages[:, : batch.completion_mask.size(1)]
        if args.position_bonus_gamma != 0.0 and self._position_bonus_active(batch.global_step):
            advantages = core_adv.position_bonus_advantages(
                advantages, batch.completion_mask, gamma=args.position_bonus_gamma
            )
        return advantages

    def _position_bonus_active(self, step: int) -> bool:
        start, length = self.args.position_bonus_start_step, self.args.position_bonus_num_steps
        return step >= start and (length is None or step < start + length)

    def _needs_rollout_candidates(self) -> bool:
        """True when a loss-side method needs top-N candidates from the rollout policy (CaSP, off-policy)."""
        return False

    def _rollout_extras(self, batch: RolloutBatch, capture: _Capture | None) -> dict:
        """Per-completion tensors carried to `compute_loss` (TRL shuffles and splits every tensor key)."""
        correct = is_correct(batch.local_rewards, self.args.correct_reward_threshold)
        return {"exploration_correct": correct}

    def _replace_logged_advantages(self, advantages: torch.Tensor, batch: RolloutBatch):
        """TRL logs GRPO's advantages in `_logs["advantages"]`; show the final ones instead."""
        if advantages.dim() == 2:
            mask = batch.completion_mask.float()
            advantages = (advantages * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        final = self._gather(advantages.float()).tolist()
        logged = self._logs["advantages"]
        for _ in range(min(len(final), len(logged))):
            logged.pop()
        logged.extend(final)

    @torch.no_grad()
    def _log_rollout_metrics(self, batch: RolloutBatch):
        if not self.args.exploration_metrics:
            return
        mode = "train" if self.model.training else "eval"
        g = batch.num_generations
        correct = is_correct(batch.rewards, self.args.correct_reward_threshold).float().view(-1, g)
        self._metrics[mode]["exploration/pass_at_G"].append(correct.max(dim=1).values.mean().item())
        # Distinct completions per group: hash each local completion's token ids, then gather.
        ids, mask = batch.completion_ids, batch.completion_mask
        hashes = torch.tensor(
            [hash(tuple(row[m.bool()].tolist())) for row, m in zip(ids, mask, strict=True)],
            dtype=torch.int64, device=ids.device,
        )
        groups = self._gather(hashes).view(-1, g)
        unique = sum(len(set(row.tolist())) for row in groups) / groups.size(0)
        self._metrics[mode]["exploration/unique_completions_per_group"].append(unique)

    # ------------------------------------------------------------------ loss side
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # TRL's compute_loss -> _compute_loss calls `_get_per_token_logps_and_entropies` once for the policy;
        # our override captures that call (hidden states, entropies) and applies `_transform_policy_logps`.
        self._loss_inputs, self._loss_state = inputs, {}
        self._ran_hooks = set()
        self._capture = _Capture(mode="loss") if self._needs_loss_capture() else None
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            capture = self._capture
        finally:
            self._capture = None
            if self._loss_state.pop("pinned_old_logps", False):
                del inputs["old_per_token_logps"]
        if capture is not None and capture.done:
            extra = self._extra_per_token_loss(inputs, capture, self._loss_state)
            if extra is not None and "importance_sampling_ratio" in inputs and self.loss_type != "vespo":
                # Weighted by vLLM's importance-sampling ratio like TRL weights its policy term (and as verl's
                # kl_cov weights its whole per-token loss), so the extra term stays an expectation under pi_old.
                extra = extra * inputs["importance_sampling_ratio"]
            if extra is not None:
                loss = loss + self._aggregate_per_token(extra, self._loss_mask(inputs), inputs)
            if self.args.exploration_metrics:
                self._log_token_metrics(inputs, capture)
        self._check_hooks_ran(
            "loss", f"TRL's loss did not call `_get_per_token_logps_and_entropies` with the policy model (it was "
            f"given a {type(model).__name__})",
        )
        self._log_loss_state_metrics(self._loss_state)
        self._loss_inputs, self._loss_state = None, {}
        return loss

    # ------------------------------------------------------------------ model card
    def create_model_card(self, model_name=None, dataset_name=None, tags=None, **kwargs):
        """Write the package's card (method and paper, rewards, hyperparameters, LoRA settings, curves) instead of
        TRL's generic one: `push_to_hub()` and every checkpoint call this. See `exploration_trl.hub.trainer_card`."""
        if not self.is_world_process_zero():
            return
        from ..hub.trainer_card import write_trainer_card

        write_trainer_card(self, output_dir=kwargs.get("output_dir"), dataset=dataset_name)

    def save_model(self, output_dir=None, _internal_call=False):
        super().save_model(output_dir, _internal_call)
        if not _internal_call:  # a user's call; checkpoints and `push_to_hub` write the card themselves
            self.create_model_card(output_dir=output_dir or self.args.output_dir)

    # ------------------------------------------------------------------ no silent no-op
    def _expected_hooks(self, side: str) -> list[str]:
        """Names of the hooks this trainer must run on every step of `side` ("advantage" or "loss").

        Each method class declares `hook = (side, name)`; a composed trainer (e.g. ProGRPO+CaSP) inherits several.
        The exploration metrics count as a loss-side hook when they are switched on.
        """
        names = [cls.__dict__["hook"][1] for cls in type(self).__mro__
                 if "hook" in cls.__dict__ and cls.__dict__["hook"][0] == side]
        if side == "loss" and self.args.exploration_metrics:
            names.append("exploration metrics")
        return names

    def _mark_hook_ran(self, name: str):
        self._ran_hooks.add(name)

    def _check_hooks_ran(self, side: str, reason: str):
        missing = [n for n in self._expected_hooks(side) if n not in self._ran_hooks]
        if missing:
            mode = "training" if self.model.training else "evaluation"
            raise HookDidNotRunError(
                f"{' and '.join(missing)}: the {side}-side hook did not run on this {mode} step ({reason}); "
                f"stopping rather than silently training plain GRPO. Please report this with your TRL version and "
                f"launcher (accelerate/DeepSpeed/FSDP config)."
            )

    @staticmethod
    def _loss_mask(inputs) -> torch.Tensor:
        mask = inputs["completion_mask"]
        return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]

    def _old_logps(self, inputs, policy_logps: torch.Tensor) -> torch.Tensor:
        """The old log-probs TRL's `_compute_loss` uses: the stored ones, or on-policy the detached current ones.

        On-policy TRL would take `returned_logps.detach()`, which after a ratio transform is no longer the
        rollout policy; so the untransformed values are pinned into `inputs` for this call (and removed after).
        """
        old = inputs.get("old_per_token_logps")
        if old is None:
            old = inputs["old_per_token_logps"] = policy_logps.detach()
            self._loss_state["pinned_old_logps"] = True
        return old

    def _transform_policy_logps(self, logps: torch.Tensor, capture: _Capture, inputs, state: dict) -> torch.Tensor:
        """Return the log-probs TRL's loss should see. TRL forms the ratio as `exp(returned - old)`, so a method
        that wants ratio `R` returns `old + log(R)`. The base returns `logps` unchanged."""
        return logps

    def _extra_per_token_loss(self, inputs, capture: _Capture, state: dict) -> torch.Tensor | None:
        """Extra `(B, T)` per-token loss terms, added after TRL's loss with TRL's aggregation. None: nothing."""
        return None

    def _aggregate_per_token(self, per_token: torch.Tensor, mask: torch.Tensor, inputs) -> torch.Tensor:
        """Reduce a per-token term exactly as TRL 1.16's `_compute_loss` reduces its policy loss for `loss_type`.

        `tests/test_trl_contract.py` checks this against TRL's own loss for every loss type.
        """
        mode = "train" if self.model.training else "eval"
        accum = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        mask = mask.to(per_token.dtype)
        lt = self.loss_type
        if lt in ("grpo", "sapo"):
            return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accum
        if lt == "bnpo":
            return (per_token * mask).sum() / mask.sum().clamp(min=1.0) / accum
        if lt == "dr_grpo":
            return (per_token * mask).sum() / (per_token.size(0) * self.max_completion_length) / accum
        if lt in ("cispo", "dapo", "vespo"):
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            return (per_token * mask).sum() / normalizer
        if lt == "luspo":
            return (per_token * mask).sum(-1).mean() / accum
        raise ValueError(f"Unknown loss type: {lt}")

    def _log_loss_state_metrics(self, state: dict):
        """Log `state["metrics"]` (name -> (sum, count)) as global means, as TRL's `global_masked_mean` does; a name
        with no element on any process (count 0, e.g. `exploration/entropy_correct` without a correct completion) is
        not logged that step rather than logged as NaN."""
        metrics = state.get("metrics")
        if not metrics:
            return
        mode = "train" if self.model.training else "eval"
        names = sorted(metrics)
        local = torch.tensor([v for n in names for v in metrics[n]], dtype=torch.float32, device=self.accelerator.device)
        totals = self.accelerator.reduce(local, reduction="sum").view(-1, 2)
        for name, (total, count) in zip(names, totals.tolist(), strict=True):
            if count > 0:  # decided from the reduced count, so every process skips alike (e.g. no correct completion)
                self._metrics[mode][name].append(total / count)

    def _step_will_log(self) -> bool:
        """Whether the optimizer step in progress ends in a log (HF's `DefaultFlowCallback` rule).

        The LM-head statistics (Λ(n), branching factor) are computed only on such steps: their logged value is the
        logging step's, not an average over the logging window (the entropy split stays an average: it is free).
        """
        args = self.args
        if not self.model.training or args.logging_strategy == "epoch":
            return True
        if args.logging_strategy == "no":
            return False
        step = self.state.global_step + 1
        every = self.state.logging_steps or args.logging_steps
        return step % max(int(every), 1) == 0 or (step == 1 and args.logging_first_step)

    @torch.no_grad()
    def _log_token_metrics(self, inputs, capture: _Capture):
        """Exploration metrics from the loss pass TRL already ran (no extra backbone pass)."""
        self._mark_hook_ran("exploration metrics")
        mask = self._loss_mask(inputs).bool()
        entropies = capture.entropies.detach().float()
        correct = inputs.get("exploration_correct")
        stats: dict[str, tuple[float, float]] = {}
        if correct is not None:
            for name, rows in (("correct", correct), ("wrong", ~correct)):
                m = mask & rows[:, None]
                stats[f"exploration/entropy_{name}"] = ((entropies * m).sum().item(), m.sum().item())
        if not self._step_will_log():  # the same decision on every process: global_step is shared
            self._log_loss_state_metrics({"metrics": stats})
            return

        positions = mask.nonzero(as_tuple=False)
        k = min(self.args.exploration_metrics_max_tokens, positions.size(0))
        # A private generator keeps the global RNG (sampling, shuffling) exactly as TRL's.
        pick = torch.randperm(positions.size(0), generator=self._metrics_generator)[:k].to(positions.device)
        rows, cols = positions[pick, 0], positions[pick, 1]
        hidden = capture.completion_hidden().detach()[rows, cols]
        targets = inputs["completion_ids"][rows, cols]
        with self._lm_head_weights() as (weight, bias, _):  # entered on every process, even with k = 0
            # Small row chunks keep the float64 vocabulary buffers of the top-p count small.
            s = token_statistics(
                hidden, weight, bias, targets, temperature=self.temperature, top_n=3,
                top_p=self.args.exploration_metrics_top_p, chunk_rows=16, entropy=False,
            )
        if k > 0:
            for n in range(3):
                stats[f"exploration/lambda_{n + 1}"] = (s["topn_logps"][:, n].sum().item(), float(k))
            stats["exploration/lambda_sample"] = (s["target_logps"].sum().item(), float(k))
            stats["exploration/branching_factor"] = (s["branching"].float().sum().item(), float(k))
        else:
            for name in ("lambda_1", "lambda_2", "lambda_3", "lambda_sample", "branching_factor"):
                stats[f"exploration/{name}"] = (0.0, 0.0)
        self._log_loss_state_metrics({"metrics": stats})

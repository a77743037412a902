"""The trainer's TRL adapter: every override of a method of TRL's `GRPOTrainer` (or transformers' `Trainer`) and
every read of their private state, in `TRLAdapter`, the base class of `ExplorationGRPOTrainer` (`trainers/base.py`).

They are written here, not in `base.py`, so that a TRL upgrade is a read of the boundary: each override says which TRL
behaviour it relies on, `tests/test_trl_contract.py` pins them and `tests/test_architecture.py` keeps them here.
Each override calls TRL's own method with `super()`: `TRLAdapter` subclasses `GRPOTrainer` directly, so two
classes stand between a public trainer and TRL's (`ProGRPOTrainer` -> `ExplorationGRPOTrainer` -> `TRLAdapter` ->
`GRPOTrainer`). Inside the overrides the adapter calls the trainer only through `TrainerSteps` (`steps.py`: one
abstract method per call up, typed); its own state between TRL's calls is written here only. The components read
TRL's state only through the accessors at the end. docs/internals.md has the picture.
"""
from __future__ import annotations

import functools
import inspect
import os
from contextlib import contextmanager, nullcontext

import torch
from trl import GRPOTrainer

from .capture import Capture, LMHead, fill
from .deepspeed_import import deepspeed_only_when_imported
from .fused_head import folding
from .loss_terms import aggregate_per_token, loss_mask, weighted_as_trl
from .steps import TrainerSteps
from .trl_warnings import quiet_trl_rollout_deprecations
from .vllm_support import VLLMSupport, check_cpu_head_size, cpu_generation_class, trl_builds, vllm_on_cpu

__all__ = ["TRLAdapter", "eval_strategy_lifted", "trl_until_assembled"]


def trl_until_assembled(override):
    """An override of TRL's acts only once `__init__` has finished; before (a subclass failing half-way, a trainer
    built by `object.__new__` as TRL's tests do) the package is "not active" and TRL's method runs, with its errors."""
    name = override.__name__

    @functools.wraps(override)
    def guarded(self, *args, **kwargs):
        if not self._assembled:
            return getattr(super(TRLAdapter, self), name)(*args, **kwargs)
        return override(self, *args, **kwargs)

    guarded.trl_until_assembled = True
    return guarded


@contextmanager
def eval_strategy_lifted(targs, has_eval_data: bool, configured: bool):
    """While TRL's `__init__` runs, set `eval_strategy` to "no" when a held-out benchmark replaces the
    `eval_dataset` transformers would ask for (`components/heldout_eval.py`), and restore it after."""
    lift = (targs is not None and configured and not has_eval_data
            and str(getattr(targs.eval_strategy, "value", targs.eval_strategy)) != "no")
    saved = targs.eval_strategy if lift else None
    if lift:
        targs.eval_strategy = "no"
    try:
        yield
    finally:
        if lift:
            targs.eval_strategy = saved


class TRLAdapter(GRPOTrainer, TrainerSteps):
    """TRL's `GRPOTrainer` with the package's overrides and accessors; `ExplorationGRPOTrainer` builds on it and
    writes the `TrainerSteps` these overrides call (see the module's docstring). Not a public trainer: use
    `ExplorationGRPOTrainer` or a method's class."""

    _tag_names = ["trl", "grpo", "exploration-trl", "rlvr"]
    # The adapter's own state between TRL's calls, written only in this class.
    _capture: Capture | None  # what the next policy pass of TRL records (None: nothing)
    _ds_replay: dict | None  # dynamic sampling's kept generations and rewards, while TRL's pass replays them
    _loss_inputs: dict | None  # the micro-batch TRL's loss is computing, and the loss hooks' state for it
    _loss_state: dict
    lm_head: LMHead  # the policy's LM head (the captured passes, the folded candidates)
    vllm: VLLMSupport  # vLLM's log-probs reused, and its shutdown

    def _build_trl(self, args, kwargs, heldout_benchmark) -> None:
        """TRL's `GRPOTrainer.__init__(*args, **kwargs)`, with the package's scopes around it: TRL's rollout
        deprecations quiet, accelerate's DeepSpeed check only when DeepSpeed is imported, the evaluation strategy
        lifted for a held-out benchmark without `eval_dataset`, and TRL's vLLM engine CPU-aware when vLLM runs there."""
        bound = inspect.signature(GRPOTrainer.__init__).bind_partial(None, *args, **kwargs).arguments
        targs = bound.get("args")
        check_cpu_head_size(targs, bound.get("model"))
        heldout_configured = heldout_benchmark is not None or getattr(targs, "eval_benchmark", None) is not None
        with quiet_trl_rollout_deprecations(), deepspeed_only_when_imported(), \
                eval_strategy_lifted(targs, bound.get("eval_dataset") is not None, heldout_configured), \
                trl_builds(cpu_generation_class() if vllm_on_cpu(targs) else None):
            super().__init__(*args, **kwargs)
        self._capture, self._ds_replay, self._loss_inputs, self._loss_state = None, None, None, {}
        self.lm_head = LMHead(self)

    def _start_vllm_support(self) -> None:
        """Build `vllm` once the trainer's strategies exist: it reads which statistics they need
        (`VLLMSupport.request_prompt_logprobs`)."""
        self.vllm = VLLMSupport(self)

    def _begin_capture(self, mode: str) -> Capture:
        """Record the next policy pass of TRL's (`mode` "rollout" or "loss") and return what it will hold."""
        self._capture = Capture(mode=mode)
        return self._capture

    def _trl_computes_old_logps(self) -> bool:
        """Mirror of TRL 1.16's condition for computing `old_per_token_logps` in `_generate_and_score_completions`.
        `tests/test_trl_contract.py` checks it against what TRL actually returns."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return self.args.gradient_accumulation_steps % generate_every != 0 or (
            self.use_vllm and self.vllm_importance_sampling_correction
        )

    # ------------------------------------------------------------------ one generation batch
    @trl_until_assembled
    def _generate_and_score_completions(self, inputs):
        """TRL's generation batch with the package's steps around it, in this order: the vLLM step, the rollout
        capture (of TRL's passes and generation's logits), dynamic sampling (its rounds; TRL's pass replays the kept
        rows), TRL's own method, the rollout statistics, then the advantage hook and the STILL shapers, whose result
        replaces TRL's advantages. Relies on TRL 1.16 generating (`_generate`), scoring (`_calculate_rewards`) and
        computing old log-probs (`_get_per_token_logps_and_entropies`) in it, and on its loss reading the returned
        `advantages`."""
        self.vllm.start_batch()
        self._capture = Capture(mode="rollout") if self._start_rollout_capture(inputs) else None
        try:
            try:
                inputs, self._ds_replay = self._dynamic_sampling_select(inputs)
                output = super()._generate_and_score_completions(inputs)
            finally:
                self._ds_replay = None
            capture = self._finish_rollout_capture(output, self._capture)
        finally:
            self._capture = None
        return self._set_advantages(output, capture)

    @trl_until_assembled
    def _generate(self, prompts):
        # Relies on TRL 1.16's `_generate_and_score_completions` generating through `_generate(prompts)` once.
        replay = self._ds_replay
        if replay is None:
            return super()._generate(prompts)
        self._take_generation_logps(replay["generation_logps"])  # read after generation, as a live one's
        return replay["generated"]

    @trl_until_assembled
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # Relies on TRL 1.16's `_calculate_rewards` returning every process's rewards (gathered), once per batch.
        from ..rewards import pop_outcomes

        replay = self._ds_replay
        if replay is not None:
            rewards_per_func, outcomes = replay["rewards_per_func"], replay["answers"]
        else:
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            outcomes = pop_outcomes()  # popped on every batch so that none is left for the next
        self._after_rewards(rewards_per_func, prompts, outcomes)
        return rewards_per_func

    @trl_until_assembled
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # Relies on TRL 1.16 calling the model's `generate` (transformers path) inside this method, once per batch.
        recorder = self._generation_recorder(capturing=self._capture is not None)
        with recorder.attached(self.lm_head.of(self.model)[0]) if recorder else nullcontext():
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        if recorder is not None:
            self._take_generation_logps(recorder.per_row(completion_ids))
        return completion_ids, logprobs

    @trl_until_assembled
    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, **kwargs
    ):
        # Relies on TRL 1.16 computing every policy log-prob through this method (`self.model` in the rollout, the
        # wrapped model in the loss) and on its fused head calling the backbone as a module (`LMHead.capturing`).
        # While `_capture` asks, the first policy call is recorded; in the loss its log-probs go through the hooks.
        capture = self._capture
        if capture is None or capture.done or not self.lm_head.is_policy(model):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, **kwargs
            )
        # A method's candidates ride on TRL's own head pass (`fused_head.py`: CaSP's top-N and their log-probs).
        request = self.lm_head.candidate_request(capture.mode, self._loss_inputs if capture.mode == "loss" else None)
        with self.lm_head.capturing(model) as chunks, \
                folding(request, input_ids, attention_mask, logits_to_keep, chunks) as folded:
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, True, **kwargs
            )
        fill(capture, logps, entropies, chunks, input_ids, logits_to_keep, folded)
        if capture.mode == "loss":
            logps = self._transform_policy_logps(logps, capture, self._loss_inputs, self._loss_state)
        return logps, (entropies if compute_entropy else None), aux

    # ------------------------------------------------------------------ the loss side
    @trl_until_assembled
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # TRL's compute_loss -> _compute_loss calls `_get_per_token_logps_and_entropies` once for the policy;
        # the override captures that call (hidden states, entropies) and applies `_transform_policy_logps`.
        self._before_loss(model, inputs)  # before the capture starts: a pre-pass is not the loss's pass
        self._loss_inputs, self._loss_state = inputs, {}
        self._reset_hooks_ran()
        self._capture = Capture(mode="loss") if self._needs_loss_capture() else None
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            capture = self._capture
        finally:
            self._capture = None
            if self._loss_state.pop("pinned_old_logps", False):
                del inputs["old_per_token_logps"]
            rollout_advantages = self._loss_state.pop("advantages_before_shaping", None)
            if rollout_advantages is not None:  # a loss hook shaped them for this call only (e.g. entropy_adv)
                inputs["advantages"] = rollout_advantages
        if capture is not None and capture.done:
            extra = self._extra_per_token_loss(inputs, capture, self._loss_state)
            if extra is not None:
                loss = loss + self._aggregate_per_token(weighted_as_trl(self, extra, inputs), loss_mask(inputs), inputs)
            if self.args.exploration_metrics:
                self._log_token_metrics(inputs, capture)
        self._check_hooks_ran(
            "loss", f"TRL's loss did not call `_get_per_token_logps_and_entropies` with the policy model (it was "
            f"given a {type(model).__name__})",
        )
        self._loss_inputs, self._loss_state = None, {}
        return loss

    def _old_logps(self, inputs, policy_logps: torch.Tensor) -> torch.Tensor:
        """The old log-probs TRL's loss uses. On-policy TRL would take `returned_logps.detach()`, which after a ratio
        transform is no longer the rollout policy's, so the untransformed ones are pinned in `inputs` for this call."""
        old = inputs.get("old_per_token_logps")
        if old is None:
            old = inputs["old_per_token_logps"] = policy_logps.detach()
            self._loss_state["pinned_old_logps"] = True
        return old

    def _aggregate_per_token(self, per_token: torch.Tensor, mask: torch.Tensor, inputs) -> torch.Tensor:
        """Reduce a per-token term exactly as TRL's `_compute_loss` reduces its policy loss (`loss_terms.py`)."""
        return aggregate_per_token(self, per_token, mask, inputs)

    @trl_until_assembled
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # TRL's `log` averages its metric window (`_metrics`): the queued values go into it first, then the
        # warnings decided from the window, then the final advantages into its completions table (`_logs`).
        final = self._before_log(len(self.logged_advantages()) if self.log_completions else 0)
        if self.log_completions:
            logged = self.logged_advantages()
            for _ in range(len(final)):
                logged.pop()
            logged.extend(final)
        super().log(logs, start_time)

    # ------------------------------------------------------------------ training, evaluation, saving
    @trl_until_assembled
    def train(self, *args, **kwargs):
        """TRL's `train`; Ctrl-C saves a checkpoint of the last finished step first (`Resume.on_interrupt`)."""
        with quiet_trl_rollout_deprecations(), deepspeed_only_when_imported():
            try:
                return super().train(*args, **kwargs)
            except KeyboardInterrupt:
                self._on_interrupt()
                raise

    @trl_until_assembled
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        # Held-out pass@k on HF's evaluation schedule (`heldout_eval.py`). An override, not a callback, because
        # `Trainer._evaluate` picks the best checkpoint from the dict `evaluate` returns.
        if not self._has_heldout_benchmark():
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        metrics: dict[str, float] = {}
        if eval_dataset is not None or self.eval_dataset is not None:
            metrics.update(super().evaluate(eval_dataset, ignore_keys, metric_key_prefix))
        was_training = self.model.training
        self.model.eval()
        try:
            with quiet_trl_rollout_deprecations():
                held = self._evaluate_heldout(metric_key_prefix)
            self.log(dict(held))
        finally:
            self.model.train(was_training)
        metrics.update(held)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    @trl_until_assembled
    def create_model_card(self, model_name=None, dataset_name=None, tags=None, **kwargs):
        """The package's card instead of TRL's (`push_to_hub()` and every checkpoint call this): the trainer's
        `write_card` (`ExplorationGRPOTrainer`, which writes `hub.trainer_card`'s)."""
        if not self.is_world_process_zero():
            return
        self.write_card(output_dir=kwargs.get("output_dir"), dataset=dataset_name)

    @trl_until_assembled
    def save_model(self, output_dir=None, _internal_call=False):
        with deepspeed_only_when_imported():
            super().save_model(output_dir, _internal_call)
            if not _internal_call:  # a user's call; checkpoints and `push_to_hub` write the card themselves
                self.create_model_card(output_dir=output_dir or self.args.output_dir)

    @trl_until_assembled
    def _save_checkpoint(self, model, trial) -> None:
        # Relies on transformers writing checkpoint `checkpoint-<global_step>` under `_get_output_dir(trial)`.
        # A checkpoint keeps the logging window's metrics (`Resume.state`), so a resumed run logs the same averages:
        # the queued values go into it first (every process saves, so the collective is safe here).
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        with self._guard_checkpoint(folder):
            self._flush_device_metrics()
            super()._save_checkpoint(model, trial)

    @trl_until_assembled
    def _save_rng_state(self, output_dir: str) -> None:
        # Relies on transformers calling this on every process inside `_save_checkpoint`, before
        # `trainer_state.json` (which marks a checkpoint complete) is written.
        super()._save_rng_state(output_dir)
        self._save_package_state(output_dir)

    @trl_until_assembled
    def _load_rng_state(self, checkpoint: str | None) -> None:
        # Relies on transformers calling this on every process once per resume, after the model and optimizer are
        # loaded and before the first `training_step`.
        super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            self._load_package_state(checkpoint)

    # ------------------------------------------------------------------ accessors of TRL's state
    # The components read TRL's (and transformers') private state only through these.
    def metrics_window(self, mode: str):
        """TRL's metric window (`_metrics[mode]`: name -> values since the last log, which `log` averages)."""
        return self._metrics[mode]

    def note_metric(self, name: str, value: float) -> None:
        """Append a number the host already knows to TRL's metric window of the current mode, now (nothing to
        reduce, no device value to read)."""
        self._metrics["train" if self.model.training else "eval"][name].append(value)

    def rollout_buffer(self) -> tuple[int, list | None]:
        """`(_step, _buffered_inputs)`: TRL 1.16's `_prepare_inputs` generates every `steps_per_generation *
        num_iterations` micro-steps and feeds slice `_step % steps_per_generation`."""
        return self._step, self._buffered_inputs

    def set_rollout_buffer(self, step: int, buffered: list | None) -> None:
        self._step, self._buffered_inputs = step, buffered

    def buffered_micro_batches(self, steps: list[int]) -> list:
        """TRL's buffered micro-batches that the micro-steps `steps` will train on."""
        return [self._buffered_inputs[s % self.args.steps_per_generation] for s in steps]

    def extra_log_columns(self):
        """TRL's pending completion-table columns from reward functions' `log_extra` (`_pending_extra_logs`)."""
        return self._pending_extra_logs

    def logged_advantages(self):
        """TRL's completions-table column of advantages (`_logs["advantages"]`, a bounded deque; TRL fills it only
        when `log_completions`)."""
        return self._logs["advantages"]

    def unwrapped_for_generation(self):
        """The policy as TRL unwraps it for generation, DeepSpeed ZeRO-3 parameters gathered (a context manager)."""
        from trl.models import unwrap_model_for_generation

        return unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                           gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                           gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs)

    def trl_sampler(self, dataset, repeat_count: int, seed: int):
        """A sampler of `dataset` in the layout of TRL's `_get_train_sampler` (a `RepeatSampler`: groups of
        `num_generations` rows contiguous, each process its contiguous slice), repeated `repeat_count` times."""
        from trl.trainer.utils import RepeatSampler

        return RepeatSampler(
            data_source=dataset, mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations, repeat_count=repeat_count,
            shuffle=self.shuffle_dataset, seed=seed,
        )

    def is_vision_language(self) -> bool:
        return bool(self._is_vlm)

    def training_dataloader(self, sampler_fn):
        """A training dataloader built as TRL's `get_train_dataloader` builds its own, with another sampler."""
        return self._get_dataloader(
            dataset=self.train_dataset, description="Training", is_training=True,
            batch_size=self._train_batch_size * self.args.steps_per_generation, sampler_fn=sampler_fn,
        )

    def trl_generate(self, prompts):
        """TRL's generation of one batch (`_generate`), outside any replay."""
        return self._generate(prompts)

    def trl_rewards(self, inputs, prompts, completions, completion_ids):
        """TRL's scoring of one batch, every process's rewards (`_calculate_rewards`), without the rollout's own."""
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids)

    def forward_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, **kwargs):
        """TRL's per-token log-probs of a forward (`_get_per_token_logps_and_entropies`)."""
        return self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                       batch_size=batch_size, **kwargs)

    def enable_entropy_bonus(self) -> None:
        """TRL 1.16 decides at init whether its entropy bonus is on, then reads `entropy_coef` every micro-batch."""
        self._entropy_bonus_enabled = True

    def run_dir(self) -> str:
        return self._get_output_dir(trial=None)

    def save_checkpoint_now(self) -> None:
        self._save_checkpoint(self.model, trial=None)


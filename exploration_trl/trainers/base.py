"""`ExplorationGRPOTrainer`: TRL's `GRPOTrainer` plus the exploration methods, and the package's one TRL adapter.

A method is a registered strategy (`strategy.py`); the trainer holds at most one of each side, named by its class
(`method = "casp"`, or `"progrpo+casp"`), and calls them at fixed points of TRL's step: the advantage hook once per
generation batch (`_compute_advantages`, then the STILL shapers), the loss hooks on every micro-batch inside TRL's own
loss (`_transform_policy_logps`, `_extra_per_token_loss`). A step on which a strategy did not act stops training
(`HookDidNotRunError`). The concerns are components the trainer owns (`rollout`, `dynamic_sampling`, `lm_head`,
`metrics`, `resume`, `vllm`, `heldout`) or callbacks (divergence, entropy band, correctness guard).

**The TRL adapter.** This is the only module of the package that overrides a private method of TRL or transformers
or reads one of their private attributes (the components use the accessors at the end of the class), so a TRL
upgrade is a read of this file. Each override says which TRL behaviour it relies on; `tests/test_trl_contract.py`
pins them and `tests/test_architecture.py` keeps them here. docs/internals.md has the picture.
"""
from __future__ import annotations

import functools
import inspect
import os
import warnings
from contextlib import nullcontext
from functools import cache

import torch
from trl import GRPOTrainer

from ..deepspeed_import import deepspeed_only_when_imported
from ..methods import register_method
from ..rewards._base import is_correct
from ..vllm_engine import vllm_runs_on_cpu
from ._trl_warnings import quiet_trl_rollout_deprecations
from .capture import LMHead, _Capture, fill
from .config import GRPO_INFO, ExplorationGRPOConfig, check_choice, check_non_negative, has_accelerator
from .correctness_guard import CorrectnessGuard
from .divergence import DivergenceCallback
from .dynamic_sampling import DynamicSampling
from .heldout_eval import HeldoutEval, eval_strategy_lifted
from .loss_terms import aggregate_per_token, loss_mask, weighted_as_trl
from .metrics_logging import ExplorationMetrics
from .resume import Resume
from .rollout import Rollout, RolloutBatch
from .strategy import bind_public_class, build_strategies, check_hooks_ran, expected_hooks, run_hook
from .still import apply_still_shapers
from .vllm_support import (
    VLLMSupport, check_cpu_head_size, connect_server, copied, reload_colocated, reload_server_from_disk,
    remove_weights_dir, server_without_nccl, trl_builds, vllm_on_cpu,
)

__all__ = [
    "ExplorationGRPOConfig", "ExplorationGRPOTrainer", "RolloutBatch", "check_choice", "check_non_negative",
    "has_accelerator",
]


def trl_until_assembled(override):
    """An override of TRL's acts only once `__init__` has finished; before (a subclass failing half-way, a trainer
    built by `object.__new__` as TRL's tests do) the package is "not active" and TRL's method runs, with its errors."""
    name = override.__name__

    @functools.wraps(override)
    def guarded(self, *args, **kwargs):
        if not self._assembled:
            return getattr(GRPOTrainer, name)(self, *args, **kwargs)
        return override(self, *args, **kwargs)

    guarded.trl_until_assembled = True
    return guarded


@register_method(GRPO_INFO)
class ExplorationGRPOTrainer(GRPOTrainer):
    """TRL `GRPOTrainer` with the exploration hooks. With no method active it trains exactly like TRL."""

    _tag_names = ["trl", "grpo", "exploration-trl", "rlvr"]
    config_class = ExplorationGRPOConfig
    #: The registered method (or `advantage+loss` composition) whose strategies this class runs; None: GRPO.
    method: str | None = None
    #: `method` parsed once, when its class is made (`strategy.bind_public_class`): what the strategies and the card
    #: read; () for GRPO.
    method_parts: tuple[str, ...] = ()
    #: True once `__init__` has built the package's state; until then every override is TRL's method.
    _assembled = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        bind_public_class(cls)  # a thin method class, `method = "<name>"`, binds its strategy

    def __init__(self, *args, heldout_benchmark=None, **kwargs):
        bound = inspect.signature(GRPOTrainer.__init__).bind_partial(None, *args, **kwargs).arguments
        targs = bound.get("args")
        check_cpu_head_size(targs, bound.get("model"))
        heldout_configured = heldout_benchmark is not None or getattr(targs, "eval_benchmark", None) is not None
        with quiet_trl_rollout_deprecations(), deepspeed_only_when_imported(), \
                eval_strategy_lifted(targs, bound.get("eval_dataset") is not None, heldout_configured), \
                trl_builds(cpu_generation_class() if vllm_on_cpu(targs) else None):
            super().__init__(*args, **kwargs)
        # The adapter's own state between TRL's calls (see `_generate_and_score_completions` and `compute_loss`).
        self._capture: _Capture | None = None  # what the next policy pass of TRL records
        self._ds_replay: dict | None = None  # the kept rows' generations and rewards, while TRL's pass replays them
        self._loss_inputs, self._loss_state = None, {}
        self._ran_hooks: set[str] = set()  # hooks that acted on the current step (see `_check_hooks_ran`)
        self._given_once: set[str] = set()  # `warn_once` keys already given
        # Components.
        self.lm_head = LMHead(self)
        self.metrics = ExplorationMetrics(self)
        self.rollout = Rollout(self)
        self.resume = Resume(self)
        self.heldout = HeldoutEval(self, heldout_benchmark)
        self.dynamic_sampling = DynamicSampling(self)
        self.strategies = build_strategies(self)
        self.vllm = VLLMSupport(self)
        # Callbacks: concerns that only observe training.
        self.correctness_guard = CorrectnessGuard(self)
        self.add_callback(self.correctness_guard)
        self._divergence = DivergenceCallback(self)
        self.add_callback(self._divergence)
        if self.args.entropy_band is not None:
            from .entropy_band import EntropyBandCallback

            self.add_callback(EntropyBandCallback(self))
        self._assembled = True

    # ------------------------------------------------------------------------------------------- strategies
    def _strategy(self, side: str):
        return next((s for s in self.strategies if s.side == side), None)

    # ------------------------------------------------------------------ what methods need
    def _needs_rollout_logps(self) -> bool:  # the rollout policy's completion log-probs and entropies
        return self.args.ppl_shaping_alpha != 0.0 or any(s.needs_rollout_logps() for s in self.strategies)

    def _needs_prompt_logps(self) -> bool:  # log p(q_t | q_<t) of the prompt tokens
        return any(s.needs_prompt_logps() for s in self.strategies)

    def _needs_rollout_candidates(self) -> bool:  # the rollout pass's hidden states (CaSP off-policy)
        return any(s.needs_rollout_candidates() for s in self.strategies)

    def _needs_loss_capture(self) -> bool:  # the loss pass's hidden states (loss hooks or metrics)
        return self.args.exploration_metrics or any(s.needs_loss_capture() for s in self.strategies)

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

    # ------------------------------------------------------------------ the advantage side
    def _compute_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """Return this process's advantages, `(B_local,)` or `(B_local, T)`: TRL's GRPO advantages, changed by the
        advantage-side strategy when there is one."""
        strategy = self._strategy("advantage")
        return batch.advantages if strategy is None else run_hook(self, strategy, "advantages", batch,
                                                                     batch.advantages)

    def _apply_still_shapers(self, advantages: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """STILL report shapers, applied after the advantage-side method (`still.py`)."""
        return apply_still_shapers(self.args, advantages, batch)

    def _rollout_extras(self, batch: RolloutBatch, capture: _Capture | None) -> dict:
        """Per-completion tensors carried to `compute_loss` (TRL shuffles and splits every tensor key)."""
        extras = {"exploration_correct": is_correct(batch.local_rewards, self.args.correct_reward_threshold)}
        for strategy in self.strategies:
            extras.update(strategy.rollout_extras(batch, capture))
        return extras

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
        need_rollout = self._start_rollout_capture(inputs)
        try:
            try:
                inputs = self._dynamic_sampling_select(inputs)
                output = super()._generate_and_score_completions(inputs)
            finally:
                self._ds_replay = None
            capture = self._finish_rollout_capture(output, need_rollout)
        finally:
            self._capture = None
        return self._set_advantages(output, capture)

    def _start_rollout_capture(self, inputs) -> bool:
        """Record this process's rows; start capturing TRL's passes when the method needs rollout statistics."""
        self.rollout.inputs = inputs
        self.rollout.generation_logps = None
        need_rollout = self.rollout.needs_statistics()
        self._capture = _Capture(mode="rollout") if need_rollout else None
        return need_rollout

    def _dynamic_sampling_select(self, inputs):
        """The rows TRL's pass scores: the kept rows of dynamic sampling's rounds (replayed from `_ds_replay`)."""
        if not self.args.dynamic_sampling or not self.model.training:
            return inputs
        kept, self._ds_replay = self.dynamic_sampling.rounds(inputs)
        self.rollout.inputs = kept
        return kept

    def _finish_rollout_capture(self, output, need_rollout: bool) -> _Capture | None:
        """The rollout statistics of TRL's finished batch `output` (None when the method needs none)."""
        return self.rollout.finish(output, self._capture) if need_rollout else None

    def _capture_from_generation(self, output) -> _Capture | None:
        """The rollout statistics from generation's own log-probs (transformers, then vLLM), when they are TRL's."""
        return self.rollout.capture_from_generation(output) or self.vllm.capture_from_generation(output)

    def _rollout_pass(self, output) -> _Capture:
        """The one added no-grad pass, run only when a method needs rollout statistics TRL did not compute."""
        self._capture = capture = _Capture(mode="rollout")
        self.rollout.added_pass(output)
        return capture

    def _set_advantages(self, output, capture: _Capture | None):
        """The advantage hook and the STILL shapers on the `RolloutBatch`; their advantages replace TRL's."""
        batch = self.rollout.batch(output, capture)
        self._ran_hooks = set()
        advantages = self._compute_advantages(batch)
        self._check_hooks_ran("advantage", "`_compute_advantages` did not reach the method's hook")
        advantages = self._apply_still_shapers(advantages, batch)
        output["advantages"] = advantages
        if self.log_completions:  # TRL reads `_logs` only then (its `log`)
            self.metrics.replace_logged_advantages(advantages, batch, self._logs["advantages"].maxlen)
        if self.args.debug_rollout_dir:
            self.rollout.dump(batch, advantages)
        output.update(self._rollout_extras(batch, capture))
        return output

    @trl_until_assembled
    def _generate(self, prompts):
        # Relies on TRL 1.16's `_generate_and_score_completions` generating through `_generate(prompts)` once.
        replay = self._ds_replay
        if replay is None:
            return super()._generate(prompts)
        self.rollout.generation_logps = replay["generation_logps"]  # read after generation, as a live one's
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
        self.rollout.after_rewards(rewards_per_func, prompts, outcomes)
        return rewards_per_func

    @trl_until_assembled
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # Relies on TRL 1.16 calling the model's `generate` (transformers path) inside this method, once per batch.
        recorder = self.rollout.recorder(capturing=self._capture is not None)
        with recorder.attached(self.lm_head.of(self.model)[0]) if recorder else nullcontext():
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        if recorder is not None:
            self.rollout.generation_logps = recorder.per_row(completion_ids)
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
        with self.lm_head.capturing(model) as chunks:
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, True, **kwargs
            )
        fill(capture, logps, entropies, chunks, input_ids, logits_to_keep)
        if capture.mode == "loss":
            logps = self._transform_policy_logps(logps, capture, self._loss_inputs, self._loss_state)
        return logps, (entropies if compute_entropy else None), aux

    # ------------------------------------------------------------------ the loss side
    @trl_until_assembled
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # TRL's compute_loss -> _compute_loss calls `_get_per_token_logps_and_entropies` once for the policy;
        # the override captures that call (hidden states, entropies) and applies `_transform_policy_logps`.
        for strategy in self.strategies:
            strategy.before_loss(model, inputs)  # before the capture starts: a pre-pass is not the loss's pass
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
            rollout_advantages = self._loss_state.pop("advantages_before_shaping", None)
            if rollout_advantages is not None:  # a loss hook shaped them for this call only (e.g. entropy_adv)
                inputs["advantages"] = rollout_advantages
        if capture is not None and capture.done:
            extra = self._extra_per_token_loss(inputs, capture, self._loss_state)
            if extra is not None:
                loss = loss + self._aggregate_per_token(weighted_as_trl(self, extra, inputs), self._loss_mask(inputs),
                                                        inputs)
            if self.args.exploration_metrics:
                self._log_token_metrics(inputs, capture)
        self._check_hooks_ran(
            "loss", f"TRL's loss did not call `_get_per_token_logps_and_entropies` with the policy model (it was "
            f"given a {type(model).__name__})",
        )
        self._loss_inputs, self._loss_state = None, {}
        return loss

    def _transform_policy_logps(self, logps: torch.Tensor, capture: _Capture, inputs, state: dict) -> torch.Tensor:
        """Return the log-probs TRL's loss should see (the loss-side strategy's `transform_logps`). TRL forms the
        ratio as `exp(returned - old)`, so a method that wants ratio `R` returns `old + log(R)`."""
        strategy = self._strategy("loss")
        return logps if strategy is None else run_hook(self, strategy, "transform_logps", logps, capture, inputs, state)

    def _extra_per_token_loss(self, inputs, capture: _Capture, state: dict) -> torch.Tensor | None:
        """Extra `(B, T)` per-token loss terms, added after TRL's loss with TRL's aggregation. None: nothing."""
        strategy = self._strategy("loss")
        return None if strategy is None else run_hook(self, strategy, "extra_loss", inputs, capture, state)

    def _log_token_metrics(self, inputs, capture: _Capture):
        """Exploration metrics from the loss pass TRL already ran (no extra backbone pass), kept on the device."""
        self.mark_hook_ran("exploration metrics")
        self.queue_metrics(self.metrics.tokens(inputs, capture, self._loss_mask(inputs).bool()))

    _loss_mask = staticmethod(loss_mask)

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

    # ------------------------------------------------------------------ no silent no-op
    def _expected_hooks(self, side: str) -> list[str]:
        return expected_hooks(self, side)

    def mark_hook_ran(self, name: str):
        """A hook acted on this step (`strategy.run_hook` marks the strategies'; see `strategy.check_hooks_ran`)."""
        self._ran_hooks.add(name)

    def _check_hooks_ran(self, side: str, reason: str):
        check_hooks_ran(self, side, reason)

    # ------------------------------------------------------------------ metrics and warnings: the one idiom
    def queue_metrics(self, metrics: dict, reduce: bool = True) -> None:
        """Log `{name: (sum, count)}` (device scalars or numbers) at the next log as the global `sum / count`, with
        no host read now; `reduce=False`: the values are global already (not summed over processes)."""
        self.metrics.add(metrics, reduce)

    def _flush_device_metrics(self):
        """Put the queued metrics into TRL's metric window now (a collective; `log` does it first)."""
        self.metrics.flush()

    def warn_once(self, key: str, message: str, category: type[Warning] = UserWarning) -> None:
        """Warn once per run under `key` (from the main process)."""
        if key in self._given_once:
            return
        self._given_once.add(key)
        if self.accelerator.is_main_process:
            warnings.warn(message, category, stacklevel=3)

    @trl_until_assembled
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # TRL's `log` averages its metric window (`_metrics`): the queued values go into it first, then the
        # warnings decided from the window, then the final advantages into its completions table (`_logs`).
        self.metrics.flush()
        self.metrics.warn_declared()
        if self.log_completions:
            logged = self._logs["advantages"]
            final = self.metrics.final_advantages(len(logged))
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
                self.resume.on_interrupt()
                raise

    @trl_until_assembled
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        # Held-out pass@k on HF's evaluation schedule (`heldout_eval.py`). An override, not a callback, because
        # `Trainer._evaluate` picks the best checkpoint from the dict `evaluate` returns.
        if self.heldout.benchmark is None:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        metrics: dict[str, float] = {}
        if eval_dataset is not None or self.eval_dataset is not None:
            metrics.update(super().evaluate(eval_dataset, ignore_keys, metric_key_prefix))
        was_training = self.model.training
        self.model.eval()
        try:
            with quiet_trl_rollout_deprecations():
                held = self.heldout.evaluate(metric_key_prefix)
            self.log(dict(held))
        finally:
            self.model.train(was_training)
        metrics.update(held)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    heldout_benchmark = property(lambda self: self.heldout.benchmark,
                                 lambda self, bench: setattr(self.heldout, "benchmark", bench))
    heldout_seconds = property(lambda self: self.heldout.seconds)
    heldout_correct_counts = property(lambda self: self.heldout.correct_counts)
    #: The sentence saying how the run diverged, or None (`divergence.py`; the card prints it).
    divergence = property(lambda self: self._divergence.note)

    @trl_until_assembled
    def create_model_card(self, model_name=None, dataset_name=None, tags=None, **kwargs):
        """The package's card instead of TRL's (`push_to_hub()` and every checkpoint call this; `hub.trainer_card`)."""
        if not self.is_world_process_zero():
            return
        from ..hub.trainer_card import write_trainer_card

        write_trainer_card(self, output_dir=kwargs.get("output_dir"), dataset=dataset_name)

    @trl_until_assembled
    def save_model(self, output_dir=None, _internal_call=False):
        with deepspeed_only_when_imported():
            super().save_model(output_dir, _internal_call)
            if not _internal_call:  # a user's call; checkpoints and `push_to_hub` write the card themselves
                self.create_model_card(output_dir=output_dir or self.args.output_dir)

    def close_vllm(self):
        """Shut the colocated vLLM engine down before any other teardown (`VLLMSupport.close`)."""
        self.vllm.close()

    @trl_until_assembled
    def _save_checkpoint(self, model, trial) -> None:
        # Relies on transformers writing checkpoint `checkpoint-<global_step>` under `_get_output_dir(trial)`.
        # A checkpoint keeps the logging window's metrics (`Resume.state`), so a resumed run logs the same averages:
        # the queued values go into it first (every process saves, so the collective is safe here).
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        with self.resume.guard_checkpoint(folder):
            self.metrics.flush()
            super()._save_checkpoint(model, trial)

    @trl_until_assembled
    def _save_rng_state(self, output_dir: str) -> None:
        # Relies on transformers calling this on every process inside `_save_checkpoint`, before
        # `trainer_state.json` (which marks a checkpoint complete) is written.
        super()._save_rng_state(output_dir)
        self.resume.save(output_dir)

    @trl_until_assembled
    def _load_rng_state(self, checkpoint: str | None) -> None:
        # Relies on transformers calling this on every process once per resume, after the model and optimizer are
        # loaded and before the first `training_step`.
        super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            self.resume.load(checkpoint)

    # ------------------------------------------------------------------ accessors of TRL's state
    # The components read TRL's (and transformers') private state only through these.
    def metrics_window(self, mode: str):
        """TRL's metric window (`_metrics[mode]`: name -> values since the last log, which `log` averages)."""
        return self._metrics[mode]

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

"""`ExplorationGRPOTrainer`: TRL's `GRPOTrainer` plus the exploration methods.

A method is a registered strategy (`strategy.py`, one module of `methods/` each); the trainer holds at most one of each
side, named by its class (`method = "casp"`, or `"progrpo+casp"`), and calls them at fixed points of TRL's step: the
advantage hook once per generation batch (`_compute_advantages`, then the STILL shapers), the loss hooks on every
micro-batch inside TRL's own loss (`_transform_policy_logps`, `_extra_per_token_loss`). A step on which a strategy did
not act stops training (`HookDidNotRunError`). The concerns are components the trainer owns (`components/`: `rollout`,
`dynamic_sampling`, `metrics`, `resume`, `heldout`; the boundary's `lm_head` and `vllm`) or callbacks (`callbacks/`:
divergence, entropy band, correctness guard).

**The TRL adapter** is the boundary's (`exploration_trl/boundary/trl_adapter.py`, this class's base): the overrides
of TRL's methods, which call this class's steps below in TRL's order, and the accessors through which the components
read TRL's private state. The steps it calls are declared, typed, in `boundary/steps.py` (`TrainerSteps`); this class
writes them, and none of the adapter's state. This module overrides no method of TRL's and
reads none of its private attributes (`tests/test_architecture.py`). docs/internals.md has the picture.
"""
from __future__ import annotations

import warnings

import torch

from ..boundary.capture import Capture
from ..boundary.loss_terms import loss_mask
from ..boundary.trl_adapter import TRLAdapter
from ..methods import register_method
from ..rewards.base import is_correct
from .callbacks.correctness_guard import CorrectnessGuard
from .callbacks.divergence import DivergenceCallback
from .components.dynamic_sampling import DynamicSampling
from .components.heldout_eval import HeldoutEval
from .components.metrics_logging import ExplorationMetrics
from .components.resume import Resume
from .components.rollout import Rollout, RolloutBatch
from .components.still import apply_still_shapers
from .config import GRPO_INFO, ExplorationGRPOConfig, check_choice, check_non_negative, has_accelerator
from .strategy import bind_public_class, build_strategies, check_hooks_ran, expected_hooks, run_hook
from .view import view_of

__all__ = [
    "ExplorationGRPOConfig", "ExplorationGRPOTrainer", "RolloutBatch", "check_choice", "check_non_negative",
    "has_accelerator",
]


@register_method(GRPO_INFO)
class ExplorationGRPOTrainer(TRLAdapter):
    """TRL `GRPOTrainer` with the exploration hooks. With no method active it trains exactly like TRL."""

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
        # TRL's `__init__`, in the boundary's scopes; then the adapter's state and `lm_head`.
        self._build_trl(args, kwargs, heldout_benchmark)
        self._ran_hooks: set[str] = set()  # hooks that acted on the current step (see `_check_hooks_ran`)
        self._given_once: set[str] = set()  # `warn_once` keys already given
        # Components, each with the view of this trainer its class declares (`view.py`: its `READS`).
        self.metrics = ExplorationMetrics(view_of(self, ExplorationMetrics))
        self.rollout = Rollout(view_of(self, Rollout))
        self.resume = Resume(view_of(self, Resume))
        self.heldout = HeldoutEval(view_of(self, HeldoutEval), heldout_benchmark)
        self.dynamic_sampling = DynamicSampling(view_of(self, DynamicSampling))
        self.strategies = build_strategies(self)
        self._start_vllm_support()
        # Callbacks (callbacks/__init__.py): one that checks what the methods feed it, one observer, one controller.
        self.correctness_guard = CorrectnessGuard(view_of(self, CorrectnessGuard))
        self.add_callback(self.correctness_guard)
        self._divergence = DivergenceCallback(view_of(self, DivergenceCallback))
        self.add_callback(self._divergence)
        if self.args.entropy_band is not None:
            from .callbacks.entropy_band import EntropyBandController

            self.add_callback(EntropyBandController(view_of(self, EntropyBandController)))
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
        """STILL report shapers, applied after the advantage-side method (`components/still.py`)."""
        return apply_still_shapers(self.args, advantages, batch)

    def _rollout_extras(self, batch: RolloutBatch, capture: Capture | None) -> dict:
        """Per-completion tensors carried to `compute_loss` (TRL shuffles and splits every tensor key)."""
        extras = {"exploration_correct": is_correct(batch.local_rewards, self.args.correct_reward_threshold)}
        for strategy in self.strategies:
            extras.update(strategy.rollout_extras(batch, capture))
        return extras

    # ------------------------------------------------------------------ one generation batch
    # The steps (`boundary.steps.TrainerSteps`) the adapter's `_generate_and_score_completions` runs around TRL's,
    # in its order.
    def _start_rollout_capture(self, inputs) -> bool:
        """Record this process's rows; True when the method needs rollout statistics (the adapter then captures)."""
        self.rollout.inputs = inputs
        self.rollout.generation_logps = None
        return self.rollout.needs_statistics()

    def _dynamic_sampling_select(self, inputs):
        """The rows TRL's pass scores, and their replay: the kept rows of dynamic sampling's rounds."""
        if not self.args.dynamic_sampling or not self.model.training:
            return inputs, None
        kept, replay = self.dynamic_sampling.rounds(inputs)
        self.rollout.inputs = kept
        return kept, replay

    def _generation_recorder(self, capturing: bool):
        return self.rollout.recorder(capturing)

    def _take_generation_logps(self, rows) -> None:
        self.rollout.generation_logps = rows

    def _after_rewards(self, rewards_per_func: torch.Tensor, prompts, outcomes: dict) -> None:
        self.rollout.after_rewards(rewards_per_func, prompts, outcomes)

    def _finish_rollout_capture(self, output, capture: Capture | None) -> Capture | None:
        """The rollout statistics of TRL's finished batch `output` (None when the method needs none)."""
        return None if capture is None else self.rollout.finish(output, capture)

    def _capture_from_generation(self, output) -> Capture | None:
        """The rollout statistics from generation's own log-probs (transformers, then vLLM), when they are TRL's."""
        return self.rollout.capture_from_generation(output) or self.vllm.capture_from_generation(output)

    def _rollout_pass(self, output) -> Capture:
        """The one added no-grad pass, run only when a method needs rollout statistics TRL did not compute."""
        capture = self._begin_capture("rollout")
        self.rollout.added_pass(output)
        return capture

    def _set_advantages(self, output, capture: Capture | None):
        """The advantage hook and the STILL shapers on the `RolloutBatch`; their advantages replace TRL's."""
        batch = self.rollout.batch(output, capture)
        self._ran_hooks = set()
        advantages = self._compute_advantages(batch)
        self._check_hooks_ran("advantage", "`_compute_advantages` did not reach the method's hook")
        advantages = self._apply_still_shapers(advantages, batch)
        output["advantages"] = advantages
        if self.log_completions:  # TRL reads `_logs` only then (its `log`)
            self.metrics.replace_logged_advantages(advantages, batch, self.logged_advantages().maxlen)
        if self.args.debug_rollout_dir:
            self.rollout.dump(batch, advantages)
        output.update(self._rollout_extras(batch, capture))
        return output

    # ------------------------------------------------------------------ the loss side
    # The hooks the adapter's `_get_per_token_logps_and_entropies` and `compute_loss` call inside TRL's loss.
    def _before_loss(self, model, inputs) -> None:
        for strategy in self.strategies:
            strategy.before_loss(model, inputs)
    def _transform_policy_logps(self, logps: torch.Tensor, capture: Capture, inputs, state: dict) -> torch.Tensor:
        """Return the log-probs TRL's loss should see (the loss-side strategy's `transform_logps`). TRL forms the
        ratio as `exp(returned - old)`, so a method that wants ratio `R` returns `old + log(R)`."""
        strategy = self._strategy("loss")
        return logps if strategy is None else run_hook(self, strategy, "transform_logps", logps, capture, inputs, state)

    def _extra_per_token_loss(self, inputs, capture: Capture, state: dict) -> torch.Tensor | None:
        """Extra `(B, T)` per-token loss terms, added after TRL's loss with TRL's aggregation. None: nothing."""
        strategy = self._strategy("loss")
        return None if strategy is None else run_hook(self, strategy, "extra_loss", inputs, capture, state)

    def _log_token_metrics(self, inputs, capture: Capture):
        """Exploration metrics from the loss pass TRL already ran (no extra backbone pass), kept on the device."""
        self.mark_hook_ran("exploration metrics")
        self.queue_metrics(self.metrics.tokens(inputs, capture, self._loss_mask(inputs).bool()))

    _loss_mask = staticmethod(loss_mask)

    # ------------------------------------------------------------------ no silent no-op
    def _expected_hooks(self, side: str) -> list[str]:
        return expected_hooks(self, side)

    def _reset_hooks_ran(self) -> None:
        self._ran_hooks = set()

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

    def _before_log(self, shown: int) -> list[float]:
        self.metrics.flush()
        self.metrics.warn_declared()
        return self.metrics.final_advantages(shown)

    def warn_once(self, key: str, message: str, category: type[Warning] = UserWarning) -> None:
        """Warn once per run under `key` (from the main process)."""
        if key in self._given_once:
            return
        self._given_once.add(key)
        if self.accelerator.is_main_process:
            warnings.warn(message, category, stacklevel=3)

    # ------------------------------------------------------------------ checkpoints and resume (`Resume`)
    def _on_interrupt(self) -> None:
        self.resume.on_interrupt()

    def _guard_checkpoint(self, folder: str):
        return self.resume.guard_checkpoint(folder)

    def _save_package_state(self, output_dir: str) -> None:
        self.resume.save(output_dir)

    def _load_package_state(self, checkpoint: str) -> None:
        self.resume.load(checkpoint)

    # ------------------------------------------------------------------ evaluation, divergence, vLLM
    def _has_heldout_benchmark(self) -> bool:
        return self.heldout.benchmark is not None

    def _evaluate_heldout(self, metric_key_prefix: str) -> dict:
        return self.heldout.evaluate(metric_key_prefix)

    heldout_benchmark = property(lambda self: self.heldout.benchmark,
                                 lambda self, bench: setattr(self.heldout, "benchmark", bench))
    heldout_seconds = property(lambda self: self.heldout.seconds)
    heldout_correct_counts = property(lambda self: self.heldout.correct_counts)
    #: The sentence saying how the run diverged, or None (`callbacks/divergence.py`; the card prints it).
    divergence = property(lambda self: self._divergence.note)

    def close_vllm(self):
        """Shut the colocated vLLM engine down before any other teardown (`VLLMSupport.close`)."""
        self.vllm.close()

    # ------------------------------------------------------------------ the model card
    def write_card(self, output_dir=None, dataset=None):
        """Write the package's card into `output_dir` (default `args.output_dir`; `hub.trainer_card`). TRL's
        `create_model_card`, which `push_to_hub()`, checkpoints and `save_model()` call, writes this one instead
        (the adapter's override)."""
        from ..hub.trainer_card import write_trainer_card

        return write_trainer_card(self, output_dir=output_dir, dataset=dataset)


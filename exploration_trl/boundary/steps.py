"""`TrainerSteps`: everything the boundary asks of the trainer above it, declared once and typed.

The TRL adapter (`trl_adapter.py`) is the trainer's base class, because TRL calls the overridden methods on the
trainer itself (`training_step` -> `_prepare_inputs` -> `_generate_and_score_completions`, `compute_loss` ->
`_get_per_token_logps_and_entropies`, `_save_checkpoint`, ...): the overrides must be in the trainer's class
hierarchy. Inside those overrides the adapter calls the package's steps, which `ExplorationGRPOTrainer`
(`trainers/base.py`) writes. Each such call up is one abstract method here, so that the calls from the boundary to
the trainer are one list, with their types, and a trainer that lacks one cannot be built (`abc`).
`tests/test_architecture.py::test_the_boundary_calls_up_only_through_trainer_steps` checks that no boundary module
reads any other member of the package's trainer. docs/internals.md says why the adapter is a base class and not an
object the trainer holds.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Any

import torch

from .capture import Capture
from .generation_logps import GenerationLogps

__all__ = ["TrainerSteps"]


class TrainerSteps(ABC):
    """The trainer's side of the boundary, in the order of a step. The adapter calls nothing else of the package's
    trainer; the adapter's own state (`_capture`, `_ds_replay`, `_loss_inputs`, `_loss_state`) and objects
    (`lm_head`, `vllm`) are the adapter's, written only there."""

    # ------------------------------------------------------------------ what the methods need (read per batch)
    @abstractmethod
    def _needs_rollout_logps(self) -> bool:
        """Whether this batch needs the rollout policy's completion log-probs and entropies."""

    @abstractmethod
    def _needs_prompt_logps(self) -> bool:
        """Whether this batch needs log p(q_t | q_<t) of the prompt tokens."""

    @abstractmethod
    def _needs_rollout_candidates(self) -> bool:
        """Whether this batch needs the rollout pass's candidate tokens (CaSP off-policy)."""

    @abstractmethod
    def _needs_loss_capture(self) -> bool:
        """Whether the loss pass must be captured (a loss hook, or the exploration metrics)."""

    # ------------------------------------------------------------------ one generation batch, in its order
    @abstractmethod
    def _start_rollout_capture(self, inputs: list[dict]) -> bool:
        """A generation batch starts with this process's rows `inputs`; True when its rollout must be captured."""

    @abstractmethod
    def _dynamic_sampling_select(self, inputs: list[dict]) -> tuple[list[dict], dict | None]:
        """The rows TRL's pass scores, and the replay (generations, rewards) of dynamic sampling's kept rows that
        `_generate` and `_calculate_rewards` then return instead of generating again (None: no replay)."""

    @abstractmethod
    def _generation_recorder(self, capturing: bool) -> GenerationLogps | None:
        """The recorder of generation's own log-probs for this batch (None: generation's are not used)."""

    @abstractmethod
    def _take_generation_logps(self, rows: list[torch.Tensor] | None) -> None:
        """Generation's per-row log-probs of this batch (recorded live, or replayed by dynamic sampling)."""

    @abstractmethod
    def _after_rewards(self, rewards_per_func: torch.Tensor, prompts: list, outcomes: dict) -> None:
        """TRL scored the batch: every process's rewards (gathered), this process's prompts, the answers read."""

    @abstractmethod
    def _finish_rollout_capture(self, output: dict, capture: Capture | None) -> Capture | None:
        """The rollout statistics of TRL's finished batch `output` from what `capture` recorded (None: not needed)."""

    @abstractmethod
    def _set_advantages(self, output: dict, capture: Capture | None) -> dict:
        """The advantage hook and the STILL shapers; returns `output` with the final advantages and the extras."""

    # ------------------------------------------------------------------ one micro-batch of TRL's loss
    @abstractmethod
    def _before_loss(self, model: torch.nn.Module, inputs: dict) -> None:
        """Before TRL's loss and before its capture starts (a strategy's pre-pass is not the loss's pass)."""

    @abstractmethod
    def _reset_hooks_ran(self) -> None:
        """A new step for the no-silent-no-op check: forget which hooks acted."""

    @abstractmethod
    def _transform_policy_logps(self, logps: torch.Tensor, capture: Capture, inputs: dict,
                                state: dict) -> torch.Tensor:
        """The policy log-probs TRL's loss should see (TRL forms its ratio as `exp(returned - old)`)."""

    @abstractmethod
    def _extra_per_token_loss(self, inputs: dict, capture: Capture, state: dict) -> torch.Tensor | None:
        """Extra `(B, T)` per-token loss terms, aggregated as TRL aggregates its loss. None: nothing."""

    @abstractmethod
    def _log_token_metrics(self, inputs: dict, capture: Capture) -> None:
        """The exploration metrics of the loss pass TRL already ran."""

    @abstractmethod
    def _check_hooks_ran(self, side: str, reason: str) -> None:
        """Stop training when a configured hook of `side` did not act on this step (`reason` says where)."""

    # ------------------------------------------------------------------ logging, checkpoints, evaluation, card
    @abstractmethod
    def _flush_device_metrics(self) -> None:
        """Put the queued device metrics into TRL's metric window (a collective: every process calls it)."""

    @abstractmethod
    def _before_log(self, shown: int) -> list[float]:
        """Before TRL's `log` averages its window: queued metrics in, declared warnings given; returns the final
        advantages of the newest `shown` completions of TRL's completions table."""

    @abstractmethod
    def _on_interrupt(self) -> None:
        """Ctrl-C in `train`: save a checkpoint of the last finished step."""

    @abstractmethod
    def _guard_checkpoint(self, folder: str) -> AbstractContextManager:
        """Around transformers' writing of checkpoint `folder` (nothing half-written is left as complete)."""

    @abstractmethod
    def _save_package_state(self, output_dir: str) -> None:
        """The package's state into a checkpoint folder (every process; before `trainer_state.json`)."""

    @abstractmethod
    def _load_package_state(self, checkpoint: str) -> None:
        """The package's state from a checkpoint folder (every process, once per resume)."""

    @abstractmethod
    def _has_heldout_benchmark(self) -> bool:
        """Whether `evaluate` runs the held-out pass@k evaluation."""

    @abstractmethod
    def _evaluate_heldout(self, metric_key_prefix: str) -> dict[str, Any]:
        """One held-out evaluation: `{name: value}` under `metric_key_prefix`."""

    @abstractmethod
    def write_card(self, output_dir: str | None = None, dataset: str | None = None) -> Any:
        """The package's model card, which TRL's `create_model_card` writes instead of TRL's."""

"""What a method sees of its run: `MethodContext`, the one object a strategy holds (`strategy.ctx`).

A strategy used to keep the whole trainer and reach into its underscore helpers and TRL's attributes. The context
names instead, once and in public, everything the 14 methods read: the run's settings, the loss pass's helpers, the
metrics queue and the warnings, the collectives, what the rollout recorded, and the optimizer step's buffered
micro-batches (KL-Cov / Clip-Cov's `cov_selection: global`). The hooks still receive the step's tensors as
arguments (`batch`, `inputs`, `capture`); the context is for everything else.

The trainer itself is not reachable from a strategy (`tests/test_architecture.py` checks that no method module reads
an underscore attribute of the context or names the trainer). A method that needs more adds a named member here,
which keeps what methods depend on in one reviewable list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["MethodContext"]


class MethodContext:
    """One trainer's view for its strategies (module docstring). Built once per trainer; every member reads the
    trainer's live state, so a value is the one of the moment it is read."""

    def __init__(self, trainer):
        self._trainer = trainer

    # ------------------------------------------------------------------------------------------------ the run
    @property
    def args(self):
        """The run's config (the method's config class: its keys, TRL's and the package's)."""
        return self._trainer.args

    @property
    def temperature(self) -> float:
        """The sampling temperature TRL divides the logits by before its log-softmax."""
        return self._trainer.temperature

    @property
    def epsilon_low(self) -> float:
        """TRL's lower clip: ratio >= 1 - epsilon_low."""
        return self._trainer.epsilon_low

    @property
    def epsilon_high(self) -> float:
        """TRL's upper clip: ratio <= 1 + epsilon_high."""
        return self._trainer.epsilon_high

    @property
    def num_processes(self) -> int:
        return self._trainer.accelerator.num_processes

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (transformers' `state.global_step`)."""
        return self._trainer.state.global_step

    @property
    def training(self) -> bool:
        """True on a training step, False on an evaluation one."""
        return self._trainer.model.training

    def updates_per_rollout(self) -> float:
        """Optimizer updates each generation batch feeds; 1 means fully on-policy (old log-probs == current)."""
        return self._trainer._updates_per_rollout()

    def trl_computes_old_logps(self) -> bool:
        """Whether TRL runs a separate pass for the rollout policy's log-probs (off-policy steps or vLLM)."""
        return self._trainer._trl_computes_old_logps()

    # -------------------------------------------------------------------------------- metrics and warnings
    def queue_metrics(self, metrics: dict, reduce: bool = True) -> None:
        """Log `{name: (sum, count)}` at the next log as the global `sum / count`, with no host read now;
        `reduce=False`: the values are global already."""
        self._trainer.queue_metrics(metrics, reduce)

    def warn_once(self, key: str, message: str) -> None:
        """Warn once per run under `key` (from the main process)."""
        self._trainer.warn_once(key, message)

    def metrics_window(self, mode: str) -> dict[str, list]:
        """Name -> the values logged since the last log, for `mode` ("train" or "eval")."""
        return self._trainer.metrics_window(mode)

    def guard_correctness(self, rewards: torch.Tensor, correct: torch.Tensor, num_generations: int, method: str,
                          effect: str) -> None:
        """Record a generation batch's correctness for the one warning when no group mixes right and wrong
        (`callbacks/correctness_guard.py`)."""
        self._trainer.correctness_guard.update(rewards, correct, num_generations, method, effect)

    # ------------------------------------------------------------------------------------------ collectives
    def sum_over_processes(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over every process (itself on one process: no collective)."""
        if self.num_processes == 1:
            return tensor
        return self._trainer.accelerator.reduce(tensor, reduction="sum")

    def gather_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every process's `tensor` (the same shape on each), stacked along dim 0 in process order."""
        from .components.collectives import gather_rows

        return gather_rows(tensor, self.num_processes)

    # ------------------------------------------------------------------------------------------ the loss pass
    @property
    def lm_head(self):
        """The policy's LM head (`ops.lm_head.LMHead`): `with ctx.lm_head.weights() as (weight, bias, regather)`."""
        return self._trainer.lm_head

    def loss_mask(self, inputs) -> torch.Tensor:
        """The `(B, T)` mask of the tokens TRL's loss counts in the micro-batch `inputs`."""
        return self._trainer._loss_mask(inputs)

    def old_logps(self, inputs, policy_logps: torch.Tensor) -> torch.Tensor:
        """The rollout policy's log-probs of `inputs` (TRL's `old_per_token_logps`, or the detached current ones
        when TRL runs fully on-policy)."""
        return self._trainer._old_logps(inputs, policy_logps)

    def forward_logps(self, model, input_ids, attention_mask, logits_to_keep: int, **kwargs):
        """TRL's per-token log-probs and entropies of one forward of `model`."""
        return self._trainer.forward_logps(model, input_ids, attention_mask, logits_to_keep, **kwargs)

    # ---------------------------------------------------------------------------------- the rollout
    @property
    def reward_outcomes(self) -> tuple[list, dict]:
        """This process's prompts of the last generation batch and the final answers each reward read."""
        return self._trainer.rollout.reward_outcomes

    def user_prompt_mask(self, output: dict[str, Any]) -> tuple[torch.Tensor, int]:
        """The mask of the last user message's tokens in the rollout's `prompt_ids` (`output`), rendered with the
        trainer's chat template, and how many prompts fell back to all their tokens."""
        from ..boundary.prompt_tokens import user_token_mask

        t = self._trainer
        prompts = [x["prompt"] for x in t.rollout.inputs]
        return user_token_mask(prompts, output["prompt_ids"], output["prompt_mask"], t.processing_class,
                               tools=t.tools or None, chat_template=t.chat_template, **t.chat_template_kwargs)

    # --------------------------------------------------------------- the optimizer step's micro-batches
    def micro_step(self) -> int:
        """The index of the micro-batch now in the loss (TRL's micro-step counter)."""
        return self._trainer.rollout_buffer()[0]

    def step_micro_batches(self) -> tuple[list[int], list]:
        """The micro-steps of the optimizer step that starts at the current micro-step, and their buffered inputs."""
        t = self._trainer
        first = self.micro_step()
        steps = [first + j for j in range(t.current_gradient_accumulation_steps)]
        return steps, t.buffered_micro_batches(steps)

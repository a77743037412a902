"""`ExplorationGRPOTrainer`: TRL's `GRPOTrainer` plus the hooks every exploration method overrides.

A method author reads this file only (the guide with a worked example: `docs/writing_a_method.md`):

* **The advantage hook** `_compute_advantages(batch)`, called once per generation batch after TRL has
  scored the completions. `batch` is a `RolloutBatch` (`rollout.py`): the rewards gathered across processes,
  the group layout, TRL's GRPO advantages and, when `_needs_rollout_logps` / `_needs_prompt_logps` say so,
  the rollout policy's per-token log-probs and entropies (and prompt-token log-probs). The STILL shapers run after it.
* **Loss hooks** that reuse TRL's `_compute_loss`: `_transform_policy_logps` changes the per-token
  importance ratio (TRL forms it as `exp(per_token_logps - old_per_token_logps)`), and
  `_extra_per_token_loss` adds per-token terms aggregated exactly as TRL's `loss_type` aggregates.
* **No silent no-op**: each method's hook is `hook = (side, name)` (set by `register_method` from its record) and it
  calls `_mark_hook_ran(name)` when it acts; a step on which a declared hook did not run stops training
  (`HookDidNotRunError`).
* **One record**: `@register_method(MethodInfo(...))` on the trainer class (`exploration_trl.methods`) is everything
  the rest of the package (help, cards, experiments) says about the method.

**One generation batch** is `_generate_and_score_completions`, the package's only override of it: it composes, in
order, the vLLM step, the rollout capture, the dynamic-sampling refill, TRL's own batch, the rollout statistics and the
advantage hook (see its docstring). The mixins provide those steps as helper methods; their few other TRL overrides
are narrow and named in each module. The mixins, one line each:

* `ResumeMixin` (`resume.py`): saves and restores TRL's rollout buffer, RNGs and pending metrics; Ctrl-C checkpoints.
* `VLLMMixin` (`vllm_support.py`): vLLM's weight sync on a CPU, its log-probs reused, its shutdown.
* `RolloutMixin` (`rollout.py`): rewards checked, rollout statistics captured, the `RolloutBatch`, the advantages set.
* `DynamicSamplingMixin` (`dynamic_sampling.py`): DAPO's rounds that drop groups whose rewards do not vary.
* `CaptureMixin` (`capture.py`): reads TRL's own forward passes (log-probs, entropies, hidden states) under any wrapper.
* `ExplorationMetricsMixin` (`metrics_logging.py`): the exploration metrics, reduced across processes.
* `HeldoutEvalMixin` (`heldout_eval.py`): held-out pass@k on HF's evaluation schedule (`eval_benchmark`).
* `DivergenceMixin` (`divergence.py`): warns once (and the card says so) when entropy climbs or reward falls to 0.

`config.py` holds the shared config keys.
"""
from __future__ import annotations

import warnings

import torch
from trl import GRPOTrainer

from ..core import advantages as core_adv
from ..errors import HookDidNotRunError
from ..methods import MethodInfo, arxiv_paper, register_method
from ..rewards._base import is_correct
from .capture import CaptureMixin, _Capture
from .config import ExplorationGRPOConfig, check_choice, check_non_negative, has_accelerator
from .dynamic_sampling import DynamicSamplingMixin
from .divergence import DivergenceMixin
from .heldout_eval import HeldoutEvalMixin
from .metrics_logging import ExplorationMetricsMixin
from .resume import ResumeMixin
from .rollout import RolloutBatch, RolloutMixin
from .vllm_support import VLLMMixin

__all__ = [
    "ExplorationGRPOConfig", "ExplorationGRPOTrainer", "RolloutBatch", "check_choice", "check_non_negative",
    "has_accelerator",
]


#: transformers 5 renamed gradient checkpointing to activation checkpointing; TRL 1.16's rollout helpers
#: (`disable_gradient_checkpointing`, `unwrap_model_for_generation`) still call the old names on every rollout,
#: whatever the config says. Only these three messages, from transformers' model code, are filtered.
_TRL_ROLLOUT_DEPRECATIONS = r"`(is_gradient_checkpointing|gradient_checkpointing_(enable|disable))` is deprecated"


@register_method(MethodInfo(
    name="grpo", side="none", display="GRPO",
    summary="TRL's GRPO unchanged, plus exploration metrics",
    description="Group Relative Policy Optimization: advantages are rewards normalised within the group of "
                "completions sampled for the same prompt.",
    paper=arxiv_paper(
        "shao2024deepseekmath",
        "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models", "Shao et al., 2024",
        ["Zhihong Shao", "Peiyi Wang", "Qihao Zhu", "Runxin Xu", "Junxiao Song", "Xiao Bi", "Haowei Zhang",
         "Mingchuan Zhang", "Y. K. Li", "Y. Wu", "Daya Guo"], 2024, "2402.03300", "cs.CL"),
    where="DeepSeekMath GRPO, as TRL 1.16",
    changes="nothing: exactly TRL's `GRPOTrainer` (tested to 1e-6) plus exploration metrics",
    knobs_note="TRL's",
))
class ExplorationGRPOTrainer(ResumeMixin, VLLMMixin, RolloutMixin, DynamicSamplingMixin, CaptureMixin,
                             ExplorationMetricsMixin, HeldoutEvalMixin, DivergenceMixin, GRPOTrainer):
    """TRL `GRPOTrainer` with the exploration hooks. With no method active it trains exactly like TRL."""

    _tag_names = ["trl", "grpo", "exploration-trl", "rlvr"]
    config_class = ExplorationGRPOConfig

    def __init__(self, *args, **kwargs):
        from ..deepspeed_import import import_deepspeed_only_when_used

        import_deepspeed_only_when_used()  # Python-API runs without DeepSpeed save without importing it (its warning)
        warnings.filterwarnings("ignore", message=_TRL_ROLLOUT_DEPRECATIONS, category=FutureWarning,
                                module="transformers.modeling_utils")
        super().__init__(*args, **kwargs)
        self._capture: _Capture | None = None
        self._loss_state: dict = {}
        self._ran_hooks: set[str] = set()  # hooks that acted on the current step (see `_check_hooks_ran`)
        self._metrics_generator = torch.Generator().manual_seed(int(self.args.seed))
        if self.args.entropy_band is not None:
            from .entropy_band import EntropyBandCallback

            self.add_callback(EntropyBandCallback(self))

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
                advantages, batch.completion_mask, gamma=args.position_bonus_gamma,
                direction=args.position_bonus_direction, scale=args.position_bonus_scale,
                center=args.position_bonus_center,
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

    # ------------------------------------------------------------------ one generation batch
    def _generate_and_score_completions(self, inputs):
        """TRL's generation batch with the package's steps around it, in this order:

        1. vLLM (`_start_vllm_batch`): forget the previous batch's prompt log-probs;
        2. rollout capture (`_start_rollout_capture`): record the rows and, when the method needs rollout statistics,
           capture TRL's passes over the completions (and generation's logits) from here on;
        3. dynamic sampling (`_dynamic_sampling_select`): when on, generate rounds until enough groups have rewards
           that vary, and return the kept rows, whose generations and rewards TRL's pass then replays;
        4. TRL's own `_generate_and_score_completions` on those rows;
        5. rollout statistics (`_finish_rollout_capture`), then the advantage hook and the STILL shapers
           (`_set_advantages`), whose result replaces TRL's advantages.
        """
        self._start_vllm_batch()
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
            rollout_advantages = self._loss_state.pop("advantages_before_shaping", None)
            if rollout_advantages is not None:  # a loss hook shaped them for this call only (e.g. entropy_adv)
                inputs["advantages"] = rollout_advantages
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
        self._log_loss_state_metrics(self._loss_state, defer=True)  # read at the next log
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

        Each method class has `hook = (side, name)` (`register_method` sets it); a composed trainer (e.g. ProGRPO+CaSP) inherits several.
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

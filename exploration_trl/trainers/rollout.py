"""The rollout side of `ExplorationGRPOTrainer` (`RolloutMixin`): rewards kept and checked, the rollout statistics a
method needs (from TRL's own old-log-prob pass, from generation's logits, or one added pass), and the `RolloutBatch`
handed to the advantage hook."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..errors import HookDidNotRunError, NoRewardError
from ..ops.lm_head import token_statistics
from ._collectives import gather_rows
from ._generation_logps import GenerationLogps, padded
from .capture import _Capture

#: Per generation batch, 1 if no reward scored any of its completions (logged as a share of the logging window).
UNSCORED_BATCHES = "rewards/unscored_batch_frac"


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


class RolloutMixin:
    """The rollout steps of `ExplorationGRPOTrainer._generate_and_score_completions`: capture the rollout statistics
    around TRL's batch, build the `RolloutBatch`, call `_compute_advantages` and the STILL shapers, and hand the final
    advantages back to TRL's loss."""

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # TRL returns the rewards of every process (gathered); keep them for the advantage hook.
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func
        # This process's prompts and the final answers each reward read from its completions (`record_outcomes`),
        # for methods that explore over outcomes; popped on every batch so that none is left for the next.
        from ..rewards import pop_outcomes

        self._last_reward_outcomes = (list(prompts), pop_outcomes())
        self._check_some_reward(rewards_per_func)
        self._log_reward_failures()
        return rewards_per_func

    def _check_some_reward(self, rewards_per_func: torch.Tensor):
        """No silent no-op when no reward scores anything (every value None/NaN: TRL then trains on zero advantages).

        Until a batch was scored this is a setup mistake, so training stops (read on the step). After that a batch
        without any score is only warned about, once: its flag (`rewards/unscored_batch_frac`) stays on the device
        and is decided at the next log. `rewards_per_func` is gathered across processes, so every process decides
        alike.
        """
        unscored = torch.isnan(rewards_per_func).all()
        if not getattr(self, "_some_reward_seen", False):
            if bool(unscored):
                names = ", ".join(self.reward_func_names)
                raise NoRewardError(
                    f"no reward scored any completion: every reward ({names}) returned None for every completion of "
                    "the first batch; check that the dataset has the columns the rewards read (e.g. `answer` for "
                    "math_accuracy) and that its reference answers parse"
                )
            self._some_reward_seen = True
        self._log_device_metrics({UNSCORED_BATCHES: (unscored.double(), 1.0)}, reduce=False)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        self._flush_device_metrics()  # the window's flags reach `_metrics` (what the base class's `log` does first)
        mode = "train" if self.model.training else "eval"
        unscored = self._metrics[mode].get(UNSCORED_BATCHES, [])
        if any(v > 0 for v in unscored) and not getattr(self, "_warned_no_reward", False):
            self._warned_no_reward = True
            names = ", ".join(self.reward_func_names)
            warnings.warn(
                f"no reward scored any completion of {sum(v > 0 for v in unscored)} of the {len(unscored)} generation "
                f"batches of the logging window ending at step {self.state.global_step} (every reward of {names} "
                f"returned None); those batches taught nothing. Logged as {UNSCORED_BATCHES}; warned once.",
                UserWarning, stacklevel=2,
            )
        super().log(logs, start_time)

    def _log_reward_failures(self):
        """Log how many completions each reward could not score on this batch, summed over processes.

        Queued for the next log (no device read on the step). The queue logs a global `sum / count`: only the main
        process counts the entry, so the reduced count is 1 and the value is the sum over processes."""
        from ..rewards import pop_failure_counts

        counts = pop_failure_counts()
        once = 1.0 if self.accelerator.is_main_process else 0.0
        self._log_device_metrics(
            {f"rewards/{name}/failures": (float(counts.get(name, 0)), once) for name in self.reward_func_names}
        )

    # ------------------------------------------------------------------ steps of `_generate_and_score_completions`
    # `ExplorationGRPOTrainer._generate_and_score_completions` (base.py) calls these in order.
    def _start_rollout_capture(self, inputs) -> bool:
        """Record this process's rows and, when the method needs rollout statistics, start capturing TRL's passes
        over the completions (and generation's logits). Returns whether a capture was started."""
        self._rollout_inputs = inputs  # the local rows (prompts, dataset columns), for hooks that need them
        self._generation_logps = None
        need_rollout = self._needs_rollout_logps() or self._needs_prompt_logps() or self._needs_rollout_candidates()
        self._capture = _Capture(mode="rollout") if need_rollout else None
        return need_rollout

    def _finish_rollout_capture(self, output, need_rollout: bool) -> _Capture | None:
        """The rollout statistics of TRL's finished batch `output` (None when the method needs none)."""
        if not need_rollout:
            return None
        capture = self._capture
        # TRL's own old-log-prob pass is reused only if it is the one we captured (same tensor object); else the
        # generation's own log-probs, else one added pass.
        if not capture.done or capture.logps is not output.get("old_per_token_logps"):
            capture = self._capture_from_generation(output) or self._rollout_pass(output)
            if not capture.done:
                raise HookDidNotRunError(
                    f"{self.method_name}: the rollout statistics it needs (log-probs, hidden states) were not "
                    "captured on this step (`_get_per_token_logps_and_entropies` did not see the policy model); "
                    "stopping rather than silently training something else. Please report this with your TRL "
                    "version and launcher."
                )
        return capture

    def _set_advantages(self, output, capture: _Capture | None):
        """Build the `RolloutBatch`, run the advantage hook and the STILL shapers, and put the final advantages (and
        the per-completion extras the loss reads) into TRL's `output`."""
        batch = self._build_rollout_batch(output, capture)
        self._ran_hooks = set()
        advantages = self._compute_advantages(batch)
        self._check_hooks_ran("advantage", "`_compute_advantages` did not reach the method's override")
        advantages = self._apply_still_shapers(advantages, batch)
        output["advantages"] = advantages
        self._replace_logged_advantages(advantages, batch)
        if self.args.debug_rollout_dir:
            self._dump_rollout(batch, advantages)
        output.update(self._rollout_extras(batch, capture))
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
        # Same aggregation as TRL: weighted nansum, NaN when every reward function returned None (a `where`, where
        # TRL's boolean-mask assignment reads the mask on the host).
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards = torch.where(torch.isnan(rewards_per_func).all(dim=1), torch.nan, rewards)
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

        The first real prompt token has no context, so it is masked out (docs/math.md, "ProGRPO: confidence-reweighted
        advantages").
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

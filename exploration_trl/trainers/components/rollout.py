"""The rollout side of the trainer (`Rollout`, a component): rewards kept and checked, the rollout statistics a method
needs (from TRL's own old-log-prob pass, from generation's logits, or one added pass), and the `RolloutBatch` handed
to the advantage hook."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import HookDidNotRunError, NoRewardError
from ...ops.lm_head import token_statistics
from .collectives import gather_rows
from ...boundary.generation_logps import GenerationLogps, padded
from ...boundary.capture import Capture
from .window_warning import WindowWarning

#: TRL's multimodal inputs, passed on to its forward passes when present.
MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                   "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")
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


def _unscored(trainer, values: list[float]) -> str:
    names = ", ".join(trainer.reward_func_names)
    return (f"no reward scored any completion of {sum(v > 0 for v in values)} of the {len(values)} generation "
            f"batches of the logging window ending at step {trainer.state.global_step} (every reward of {names} "
            f"returned None); those batches taught nothing. Logged as {UNSCORED_BATCHES}; warned once.")


class Rollout:
    """One trainer's rollout: what its rewards gave, the statistics its method needs, the `RolloutBatch`."""

    #: What it reads of its trainer (`trainers/view.py`): the only names its view gives.
    READS = ("accelerator", "args", "environment_factories", "forward_logps", "is_vision_language",
             "lm_head", "method_name", "metrics", "model", "num_generations", "num_generations_eval", "queue_metrics",
             "reward_func_names", "reward_weights", "rollout_func", "state", "strategies", "temperature",
             "tools", "use_transformers_continuous_batching", "use_vllm", "vllm", "_capture_from_generation",
             "_needs_prompt_logps", "_needs_rollout_candidates", "_needs_rollout_logps", "_rollout_pass",
             "_trl_computes_old_logps")

    def __init__(self, view):
        self.view = view
        self.rewards_per_func: torch.Tensor | None = None  # the last batch's, gathered by TRL
        self.reward_outcomes: tuple[list, dict] = ([], {})  # this process's prompts, and the answers rewards read
        self.some_reward_seen = False
        self.inputs = None  # this process's rows of the batch in progress (prompts, dataset columns)
        self.generation_logps: list[torch.Tensor] | None = None
        self.dumps = 0
        self.window_warnings = (WindowWarning(UNSCORED_BATCHES, _unscored),)

    # --------------------------------------------------------------------------------------------- rewards
    def after_rewards(self, rewards_per_func: torch.Tensor, prompts, outcomes: dict) -> None:
        """TRL returned the rewards of every process (gathered): keep them for the advantage hook, with this
        process's prompts and the final answers each reward read (`rewards.record_outcomes`), and check them."""
        self.rewards_per_func = rewards_per_func
        self.reward_outcomes = (list(prompts), outcomes)
        self.check_some_reward(rewards_per_func)
        self.log_failures()

    def check_some_reward(self, rewards_per_func: torch.Tensor) -> None:
        """No silent no-op when no reward scores anything (every value None/NaN: TRL then trains on zero advantages).

        Until a batch was scored this is a setup mistake, so training stops (read on the step). After that a batch
        without any score is only warned about, once: its flag (`rewards/unscored_batch_frac`) stays on the device
        and is decided at the next log. `rewards_per_func` is gathered across processes, so every process decides
        alike.
        """
        t = self.view
        unscored = torch.isnan(rewards_per_func).all()
        if not self.some_reward_seen:
            if bool(unscored):
                names = ", ".join(t.reward_func_names)
                raise NoRewardError(
                    f"no reward scored any completion: every reward ({names}) returned None for every completion of "
                    "the first batch; check that the dataset has the columns the rewards read (e.g. `answer` for "
                    "math_accuracy) and that its reference answers parse"
                )
            self.some_reward_seen = True
        t.queue_metrics({UNSCORED_BATCHES: (unscored.double(), 1.0)}, reduce=False)

    def log_failures(self) -> None:
        """Log how many completions each reward could not score on this batch, summed over processes.

        Queued for the next log (no device read on the step). The queue logs a global `sum / count`: only the main
        process counts the entry, so the reduced count is 1 and the value is the sum over processes."""
        from ...rewards import pop_failure_counts

        t = self.view
        counts = pop_failure_counts()
        once = 1.0 if t.accelerator.is_main_process else 0.0
        t.queue_metrics({f"rewards/{name}/failures": (float(counts.get(name, 0)), once) for name in t.reward_func_names})

    # ------------------------------------------------------------------ the steps of a generation batch
    def needs_statistics(self) -> bool:
        t = self.view
        return t._needs_rollout_logps() or t._needs_prompt_logps() or t._needs_rollout_candidates()

    def records_generation_logps(self, capturing: bool) -> bool:
        """Whether this rollout's log-probs can come from generation (see `_generation_logps`)."""
        t = self.view
        return (
            t.args.rollout_logps_from_generation and capturing and t._needs_rollout_logps()
            and not t._needs_rollout_candidates() and not t._trl_computes_old_logps() and not t.use_vllm
            and not t.use_transformers_continuous_batching and not t.tools and not t.is_vision_language()
            and t.environment_factories is None and t.rollout_func is None
        )

    def recorder(self, capturing: bool) -> GenerationLogps | None:
        return GenerationLogps(self.view.temperature) if self.records_generation_logps(capturing) else None

    def capture_from_generation(self, output) -> Capture | None:
        """The rollout capture built from generation's log-probs, when they match TRL's completions."""
        rows = self.generation_logps
        self.generation_logps = None
        if rows is None:
            return None
        lengths = output["completion_mask"].sum(dim=1).tolist()
        if [r.numel() for r in rows] != [int(n) for n in lengths]:  # e.g. TRL post-processed the completions
            return None
        logps = padded(rows, output["completion_ids"].size(1), output["completion_ids"].device)
        return Capture(mode="rollout", logps=logps)

    def finish(self, output, capture: Capture) -> Capture:
        """The rollout statistics of TRL's finished batch `output`: TRL's own old-log-prob pass when it is the one
        captured (same tensor object), else the generation's own log-probs, else one added pass."""
        t = self.view
        if not capture.done or capture.logps is not output.get("old_per_token_logps"):
            capture = t._capture_from_generation(output) or t._rollout_pass(output)
            if not capture.done:
                raise HookDidNotRunError(
                    f"{t.method_name}: the rollout statistics it needs (log-probs, hidden states) were not "
                    "captured on this step (`_get_per_token_logps_and_entropies` did not see the policy model); "
                    "stopping rather than silently training something else. Please report this with your TRL "
                    "version and launcher."
                )
        return capture

    def added_pass(self, output) -> None:
        """The one added no-grad pass over the batch's prompts and completions (the trainer's capture records it)."""
        t = self.view
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        args = t.args
        batch_size = args.per_device_train_batch_size if t.model.training else args.per_device_eval_batch_size
        with torch.no_grad():
            t.forward_logps(t.model, input_ids, attention_mask, output["completion_ids"].size(1), batch_size=batch_size,
                            compute_entropy=True, **{k: output[k] for k in MULTIMODAL_KEYS if k in output})

    def batch(self, output, capture: Capture | None) -> RolloutBatch:
        t = self.view
        rewards_per_func = self.rewards_per_func
        weights = t.reward_weights.to(rewards_per_func.device)
        # Same aggregation as TRL: weighted nansum, NaN when every reward function returned None (a `where`, where
        # TRL's boolean-mask assignment reads the mask on the host).
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards = torch.where(torch.isnan(rewards_per_func).all(dim=1), torch.nan, rewards)
        n_local = output["completion_ids"].size(0)
        rank = t.accelerator.process_index
        mode = "train" if t.model.training else "eval"
        batch = RolloutBatch(
            rewards=rewards,
            rewards_per_func=rewards_per_func,
            advantages=output["advantages"],
            num_generations=t.num_generations if mode == "train" else t.num_generations_eval,
            process_slice=slice(rank * n_local, (rank + 1) * n_local),
            prompt_ids=output["prompt_ids"],
            prompt_mask=output["prompt_mask"],
            completion_ids=output["completion_ids"],
            completion_mask=output["completion_mask"],
            num_processes=t.accelerator.num_processes,
            global_step=t.state.global_step,
        )
        if capture is not None:
            batch.completion_logps = capture.logps
            batch.completion_entropies = capture.entropies
            if t._needs_prompt_logps():
                batch.prompt_logps, batch.prompt_logps_mask = self.prompt_logps(capture, output)
        t.metrics.rollout(batch)
        return batch

    def dump(self, batch: RolloutBatch, advantages: torch.Tensor) -> None:
        """Save what the advantage hook saw and returned, one file per process and generation batch."""
        import os

        t = self.view
        os.makedirs(t.args.debug_rollout_dir, exist_ok=True)
        self.dumps += 1
        keep = ("rewards", "advantages", "completion_ids", "completion_mask", "completion_logps", "prompt_ids",
                "prompt_mask", "prompt_logps", "prompt_logps_mask")
        payload = {k: getattr(batch, k) for k in keep}
        payload.update(final_advantages=advantages, num_generations=batch.num_generations,
                       process_index=t.accelerator.process_index)
        payload = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in payload.items()}
        name = f"rollout{self.dumps:04d}_rank{t.accelerator.process_index}.pt"
        torch.save(payload, os.path.join(t.args.debug_rollout_dir, name))

    # --------------------------------------------------------------------------------------- prompt log-probs
    # The rollout owns them: it computes them (from the captured pass, vLLM's prompt log-probs or one prompt-only
    # forward) and lets the strategies choose the tokens; the trainer only asks whether a method needs them.
    def prompt_logps(self, capture: Capture, output) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt log-probs and mask the advantage hook reads: every prompt token's (`prompt_token_logps`),
        narrowed by each strategy's `prompt_logps` (e.g. only the user's tokens)."""
        logps, mask = self.prompt_token_logps(capture, output)
        for strategy in self.view.strategies:
            logps, mask = strategy.prompt_logps(logps, mask, output)
        return logps, mask

    @torch.no_grad()
    def prompt_token_logps(self, capture: Capture, output) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(q_t | q_<t) for prompt tokens, computed once per unique prompt and shared by its rows.

        The first real prompt token has no context, so it is masked out (docs/math.md: the caller masks it).
        """
        t = self.view
        prompt_ids, prompt_mask = output["prompt_ids"], output["prompt_mask"]
        n, plen = prompt_ids.shape
        # Rows of one prompt are contiguous (TRL's RepeatSampler); keep the first row of each run.
        same_as_prev = torch.zeros(n, dtype=torch.bool, device=prompt_ids.device)
        same_as_prev[1:] = (prompt_ids[1:] == prompt_ids[:-1]).all(dim=1) & (prompt_mask[1:] == prompt_mask[:-1]).all(dim=1)
        owners = torch.cumsum(~same_as_prev, 0) - 1  # index among unique prompts for each row
        unique_rows = (~same_as_prev).nonzero(as_tuple=True)[0]

        logps = torch.zeros(n, plen, device=prompt_ids.device)
        if capture.hidden is None:  # rollout log-probs came from generation: one pass over the unique prompts
            unique_logps = self._prompt_only(prompt_ids[unique_rows], prompt_mask[unique_rows])
        else:
            hidden = capture.hidden[unique_rows, : max(plen - 1, 0)]  # predicts prompt tokens 1..plen-1
            targets = prompt_ids[unique_rows, 1:]
            with t.lm_head.weights() as (weight, bias, _):  # entered on every process: it may gather
                stats = token_statistics(
                    hidden.reshape(-1, hidden.size(-1)), weight, bias, targets.reshape(-1),
                    temperature=t.temperature, top_n=1, entropy=False,
                )
            unique_logps = stats["target_logps"].view(len(unique_rows), max(plen - 1, 0))
        if plen > 1:
            logps[:, 1:] = unique_logps[owners]
        mask = prompt_mask.clone()
        first_valid = prompt_mask.float().argmax(dim=1)
        mask[torch.arange(n, device=mask.device), first_valid] = 0
        return logps, mask

    def _prompt_only(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """The prompt-only log-probs: vLLM's when it returned them (colocate), else one forward (`prompt_only_logps`)."""
        from_vllm = self.view.vllm.prompt_only_logps(prompt_ids, prompt_mask)
        return from_vllm if from_vllm is not None else self.prompt_only_logps(prompt_ids, prompt_mask)

    @torch.no_grad()
    def prompt_only_logps(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """`(U, P - 1)`: log p(q_t | q_<t), t >= 1, from one no-grad forward over the prompts alone.

        A single forward whatever the number of rows (`batch_size` = all of them), so that every process runs the
        same number of forwards under ZeRO-3/FSDP, where each forward gathers parameters.
        """
        keep = max(prompt_ids.size(1) - 1, 1)
        logps, _, _ = self.view.forward_logps(self.view.model, prompt_ids, prompt_mask, keep,
                                                 batch_size=prompt_ids.size(0))
        return logps[:, -(prompt_ids.size(1) - 1):] if prompt_ids.size(1) > 1 else logps[:, :0]

"""Dynamic sampling (DAPO, Yu et al. 2025, arXiv 2503.14476, Sec. 3.2 / Eq. 11), as `DynamicSamplingMixin`.

Groups whose rewards do not vary are dropped and more prompts are generated until the generation batch is full
again (`dynamic_sampling: true`). TRL 1.16 has no such option (its `paper_index.md`: "Not supported in TRL").

How it sits in TRL's flow (one generation batch; every process runs the same steps, so collectives match):

1. **Rounds.** Each round generates and scores with TRL's own `_generate(prompts)` and `_calculate_rewards`
   (rewards are gathered across processes by TRL, so the keep/drop decision, `core.dynamic_sampling.group_varies`,
   is global and identical on every process). Round 0 is the batch TRL's dataloader gave; later rounds draw
   batches from a second iterator over the training set (`_refill_batch`), built like TRL's own train dataloader
   (a `RepeatSampler`, so groups of `num_generations` rows stay contiguous and each process gets its contiguous
   slice) with `repeat_count=1` and another seed, so TRL's epoch loop is not disturbed.
2. **Selection.** The first `needed = generation_batch_size / num_generations` varying groups, in round order;
   if `dynamic_sampling_max_rounds` extra rounds were not enough, the earliest dropped groups fill the batch
   (`dynamic_sampling_on_exhausted: fill`, warned once, logged every step) or training stops (`error`, as verl).
3. **Exchange.** The selected rows (token ids, dataset columns, generation log-probs) are gathered once, and
   each process takes its usual contiguous slice of the global batch (a group may span processes).
4. **Replay.** TRL's `_generate_and_score_completions` runs once on the selected rows, with `_generate` and
   `_calculate_rewards` returning the stored results. Everything after generation (advantages and their
   `scale_rewards` normalisation, old/ref log-probs, `num_items_in_batch`, logging, the advantage hook, the
   rollout statistics of ProGRPO / DS-GRPO, CaSP's candidates) therefore sees only the kept rows.

Relies on TRL 1.16's `_generate_and_score_completions` calling `self._generate(prompts)` once with
`[x["prompt"] for x in inputs]` and `self._calculate_rewards(inputs, prompts, completions, completion_ids)` once,
and on `_get_train_sampler`'s `RepeatSampler` layout; `tests/test_trl_contract.py` pins both.
"""

from __future__ import annotations

import warnings

import torch
from accelerate.utils import gather_object
from torch.utils.data import IterableDataset
from trl.trainer.utils import RepeatSampler

from ..core.dynamic_sampling import GroupSelector, group_varies, rows_of_groups


class DynamicSamplingMixin:
    """Mixed into `ExplorationGRPOTrainer`, whose `_generate_and_score_completions` calls `_dynamic_sampling_select`
    after the rollout capture started (generation's log-probs are recorded in every round) and before TRL's pass, so
    the rollout statistics then built describe the kept rows."""

    _ds_replay: dict | None = None
    _ds_iterator = None
    #: Refill batches drawn so far, and how many a resumed run must skip before its first refill (`resume.py` saves
    #: and restores the count, so a resumed run refills from the prompts the uninterrupted one would).
    _ds_drawn = 0
    _ds_skip = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.args.dynamic_sampling:
            self._check_dynamic_sampling_supported()

    def _check_dynamic_sampling_supported(self):
        unsupported = [name for name, used in (
            ("tools", bool(self.tools)), ("environment_factory", self.environment_factories is not None),
            ("rollout_func", self.rollout_func is not None), ("a vision-language model", self._is_vlm),
            ("an IterableDataset", isinstance(self.train_dataset, IterableDataset)),
        ) if used]
        if unsupported:
            raise ValueError(f"dynamic_sampling does not support {' or '.join(unsupported)} yet; set "
                             "dynamic_sampling: false (text prompts and a map-style dataset are supported)")

    # ------------------------------------------------------------------ the generation batch
    def _dynamic_sampling_select(self, inputs):
        """The rows TRL's `_generate_and_score_completions` should score: `inputs` itself when dynamic sampling is off
        (or in evaluation); else the selected rows, with their generations and rewards stored for the replay
        (`_ds_replay`, which the caller clears once TRL's pass is done)."""
        if not self.args.dynamic_sampling or not self.model.training:
            return inputs
        kept_inputs, self._ds_replay = self._dynamic_sampling_rounds(inputs)
        self._rollout_inputs = kept_inputs  # RolloutMixin's record of this process's rows
        return kept_inputs

    def _generate(self, prompts):
        replay = self._ds_replay
        if replay is None:
            return super()._generate(prompts)
        self._generation_logps = replay["generation_logps"]  # RolloutMixin reads it after generation
        return replay["generated"]

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self._ds_replay is not None:
            return self._ds_replay["rewards_per_func"]
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    # ------------------------------------------------------------------ rounds
    def _dynamic_sampling_rounds(self, inputs):
        args, g = self.args, self.num_generations
        n_local = len(inputs)
        selector = GroupSelector(n_local * self.accelerator.num_processes // g)
        rows, rewards = [], []  # per round: this process's row records; the global rewards_per_func
        batch = inputs
        for r in range(args.dynamic_sampling_max_rounds + 1):
            if r > 0:
                batch = self._refill_batch()
            round_rows, rewards_per_func = self._sampling_round(batch)
            rows.append(round_rows)
            rewards.append(rewards_per_func)
            weights = self.reward_weights.to(rewards_per_func.device)
            total = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # TRL's aggregation, NaN if unscored
            total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
            selector.add_round(group_varies(total, g, args.dynamic_sampling_metric, args.correct_reward_threshold))
            if selector.full:
                break
        selection = selector.finish()
        if selection.filled and args.dynamic_sampling_on_exhausted == "error":
            raise RuntimeError(
                f"dynamic_sampling: after {selection.rounds} generation rounds only {len(selection.kept)} of "
                f"{selector.needed} groups had rewards that vary; raise dynamic_sampling_max_rounds, use easier "
                "prompts, or set dynamic_sampling_on_exhausted: fill"
            )
        self._log_dynamic_sampling(selection, len(rewards[0]) // g)
        order = rows_of_groups(selection.groups, g)  # (round, global row) of the final global batch, in order
        return self._exchange_rows(order, rows, rewards, n_local)

    def _sampling_round(self, inputs):
        """Generate and score one batch with TRL's own methods; return per-row records and global rewards."""
        prompts = [x["prompt"] for x in inputs]
        self._generation_logps = None
        prompt_ids, completion_ids, _, completions, logprobs, _, _, _ = self._generate(prompts)
        generation_logps = self._generation_logps
        self._generation_logps = None
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids)
        self._check_some_reward(rewards_per_func)  # a first batch no reward scores is a setup mistake: stop now
        extra_logs = {k: list(v) for k, v in self._pending_extra_logs.items()}  # reward funcs' `log_extra` columns
        self._pending_extra_logs.clear()
        records = []
        for i, example in enumerate(inputs):
            records.append({
                "input": example, "prompt_ids": prompt_ids[i], "completion_ids": completion_ids[i],
                "completion": completions[i], "logprobs": None if logprobs is None else logprobs[i],
                "generation_logps": None if generation_logps is None else generation_logps[i].detach().cpu(),
                "extra_logs": {k: v[i] for k, v in extra_logs.items() if i < len(v)},
            })
        return records, rewards_per_func

    def _refill_batch(self):
        """The next local generation batch from a second iterator over the training set (restarted when spent)."""
        if self._ds_iterator is None:
            self._ds_dataloader = self._get_dataloader(
                dataset=self.train_dataset, description="Training", is_training=True,
                batch_size=self._train_batch_size * self.args.steps_per_generation,  # as TRL's get_train_dataloader
                sampler_fn=self._refill_sampler,
            )
            if self._ds_skip:
                # A resumed run: move to where the interrupted one was. Creating a DataLoader iterator draws from the
                # global torch RNG, whose draws before the checkpoint are already in the state the checkpoint
                # restored, so the skipping runs on a forked RNG.
                with torch.random.fork_rng(devices=[]):
                    self._ds_iterator = iter(self._ds_dataloader)
                    for _ in range(self._ds_skip):
                        self._next_refill()
                self._ds_skip = 0
            else:
                self._ds_iterator = iter(self._ds_dataloader)
        self._ds_drawn += 1
        return self._next_refill()

    def _next_refill(self):
        try:
            return next(self._ds_iterator)
        except StopIteration:
            self._ds_iterator = iter(self._ds_dataloader)
            return next(self._ds_iterator)

    def _refill_sampler(self, dataset) -> RepeatSampler:
        # TRL's `_get_train_sampler` layout, each prompt batch once (TRL repeats it steps_per_generation x
        # num_iterations times for its buffered steps), and another seed so refills are not the main loop's prompts.
        return RepeatSampler(
            data_source=dataset, mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations, repeat_count=1,
            shuffle=self.shuffle_dataset, seed=self.args.seed + 1,
        )

    # ------------------------------------------------------------------ exchange and replay
    def _exchange_rows(self, order, rows, rewards, n_local):
        """Gather the selected rows so each process holds its slice `[rank * n_local, (rank + 1) * n_local)` of the
        final global batch, and build what `_generate` / `_calculate_rewards` replay."""
        rank = self.accelerator.process_index
        mine = [(pos, rows[r][row - rank * n_local]) for pos, (r, row) in enumerate(order)
                if rank * n_local <= row < (rank + 1) * n_local]
        if self.accelerator.num_processes > 1:
            mine = gather_object(mine)  # one collective per generation batch: token ids and dataset columns only
        by_pos = dict(mine)
        local = [by_pos[pos] for pos in range(rank * n_local, (rank + 1) * n_local)]
        rewards_per_func = torch.stack([rewards[r][row] for r, row in order])
        extra_columns = sorted({k for rec in local for k in rec["extra_logs"]})
        for column in extra_columns:
            self._pending_extra_logs[column].extend(rec["extra_logs"].get(column) for rec in local)
        logprobs = [rec["logprobs"] for rec in local]
        gen_logps = [rec["generation_logps"] for rec in local]
        device = self.accelerator.device
        generated = (
            [rec["prompt_ids"] for rec in local], [rec["completion_ids"] for rec in local], None,
            [rec["completion"] for rec in local], None if any(x is None for x in logprobs) else logprobs, {}, None, [],
        )
        replay = {
            "generated": generated, "rewards_per_func": rewards_per_func,
            "generation_logps": None if any(x is None for x in gen_logps) else [x.to(device) for x in gen_logps],
        }
        return [rec["input"] for rec in local], replay

    def _log_dynamic_sampling(self, selection, groups_per_round: int):
        generated = selection.rounds * groups_per_round
        metrics = self._metrics["train"]
        metrics["dynamic_sampling/rounds"].append(float(selection.rounds))
        metrics["dynamic_sampling/dropped_groups"].append(float(selection.dropped))
        metrics["dynamic_sampling/kept_frac"].append((generated - selection.dropped) / generated)
        metrics["dynamic_sampling/filled_groups"].append(float(len(selection.filled)))
        if selection.filled and not getattr(self, "_warned_ds_filled", False):
            self._warned_ds_filled = True
            warnings.warn(
                f"dynamic_sampling: at step {self.state.global_step}, {selection.rounds} generation rounds found only "
                f"{len(selection.kept)} of {len(selection.groups)} groups whose rewards vary; the batch was filled "
                f"with {len(selection.filled)} groups that do not (they carry no GRPO advantage). Logged every step "
                "as dynamic_sampling/filled_groups; raise dynamic_sampling_max_rounds or use easier prompts. Warned "
                "once.", UserWarning, stacklevel=2,
            )

"""Dynamic sampling (DAPO, Yu et al. 2025, arXiv 2503.14476, Sec. 3.2 / Eq. 11), as `DynamicSampling`, a component
of the trainer.

Groups whose rewards do not vary are dropped and more prompts are generated until the generation batch is full
again (`dynamic_sampling: true`). TRL 1.16 has no such option (its `paper_index.md`: "Not supported in TRL").

How it sits in TRL's flow (one generation batch; every process runs the same steps, so collectives match):

1. **Rounds.** Each round generates and scores with TRL's own `_generate(prompts)` and `_calculate_rewards`
   (rewards are gathered across processes by TRL, so the keep/drop decision, `core.dynamic_sampling.group_varies`,
   is global and identical on every process). Round 0 is the batch TRL's dataloader gave; later rounds draw
   batches from a second iterator over the training set (`refill_batch`), built like TRL's own train dataloader
   (a `RepeatSampler`, so groups of `num_generations` rows stay contiguous and each process gets its contiguous
   slice) with `repeat_count=1` and another seed, so TRL's epoch loop is not disturbed.
2. **Selection.** The first `needed = generation_batch_size / num_generations` varying groups, in round order;
   if `dynamic_sampling_max_rounds` extra rounds were not enough, the earliest dropped groups fill the batch
   (`dynamic_sampling_on_exhausted: fill`, warned once, logged every step) or training stops (`error`, as verl).
3. **Exchange.** The selected rows (token ids, dataset columns, generation log-probs, the answers the rewards read)
   are gathered once, and each process takes its usual contiguous slice of the global batch (a group may span
   processes).
4. **Replay.** TRL's `_generate_and_score_completions` runs once on the selected rows, with `_generate` and
   `_calculate_rewards` returning the stored results (the trainer's overrides, `boundary/trl_adapter.py`).
   Everything after generation (advantages and their `scale_rewards` normalisation, old/ref log-probs,
   `num_items_in_batch`, logging, the advantage hook, the rollout statistics, CaSP's candidates) therefore sees only
   the kept rows.
"""

from __future__ import annotations

import torch
from accelerate.utils import gather_object
from torch.utils.data import IterableDataset

from ...core.dynamic_sampling import GroupSelector, group_varies, rows_of_groups


class DynamicSampling:
    """One trainer's dynamic sampling: its refill iterator and the position it reached (saved with checkpoints)."""

    #: What it reads of its trainer (`trainers/view.py`): the only names its view gives.
    READS = ("accelerator", "args", "environment_factories", "extra_log_columns", "is_vision_language",
             "num_generations", "queue_metrics", "reward_weights", "rollout", "rollout_func", "state", "tools",
             "train_dataset", "training_dataloader", "trl_generate", "trl_rewards", "trl_sampler", "warn_once")

    def __init__(self, view):
        self.view = view
        self.iterator = None
        self.dataloader = None
        #: Refill batches drawn so far, and how many a resumed run must skip before its first refill (`resume.py`
        #: saves and restores the count, so a resumed run refills from the prompts the uninterrupted one would).
        self.drawn = 0
        self.skip = 0
        if view.args.dynamic_sampling:
            self.check_supported()

    def check_supported(self):
        t = self.view
        unsupported = [name for name, used in (
            ("tools", bool(t.tools)), ("environment_factory", t.environment_factories is not None),
            ("rollout_func", t.rollout_func is not None), ("a vision-language model", t.is_vision_language()),
            ("an IterableDataset", isinstance(t.train_dataset, IterableDataset)),
        ) if used]
        if unsupported:
            raise ValueError(f"dynamic_sampling does not support {' or '.join(unsupported)} yet; set "
                             "dynamic_sampling: false (text prompts and a map-style dataset are supported)")

    # ------------------------------------------------------------------ rounds
    def rounds(self, inputs):
        """`(kept rows, replay)`: the generation batch's rows after dropping groups whose rewards do not vary, and
        the generations and rewards TRL's pass replays for them."""
        t = self.view
        args, g = t.args, t.num_generations
        n_local = len(inputs)
        selector = GroupSelector(n_local * t.accelerator.num_processes // g)
        rows, rewards = [], []  # per round: this process's row records; the global rewards_per_func
        batch = inputs
        for r in range(args.dynamic_sampling_max_rounds + 1):
            if r > 0:
                batch = self.refill_batch()
            round_rows, rewards_per_func = self.sampling_round(batch)
            rows.append(round_rows)
            rewards.append(rewards_per_func)
            weights = t.reward_weights.to(rewards_per_func.device)
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
        self.log(selection, len(rewards[0]) // g)
        order = rows_of_groups(selection.groups, g)  # (round, global row) of the final global batch, in order
        return self.exchange(order, rows, rewards, n_local)

    def sampling_round(self, inputs):
        """Generate and score one batch with TRL's own methods; return per-row records and global rewards."""
        from ...rewards import pop_outcomes

        t = self.view
        prompts = [x["prompt"] for x in inputs]
        t.rollout.generation_logps = None
        prompt_ids, completion_ids, _, completions, logprobs, _, _, _ = t.trl_generate(prompts)
        generation_logps = t.rollout.generation_logps
        t.rollout.generation_logps = None
        rewards_per_func = t.trl_rewards(inputs, prompts, completions, completion_ids)
        answers = pop_outcomes()  # the final answers each reward read, replayed with the kept rows
        t.rollout.check_some_reward(rewards_per_func)  # a first batch no reward scores is a setup mistake: stop now
        pending = t.extra_log_columns()  # reward funcs' `log_extra` columns
        extra_logs = {k: list(v) for k, v in pending.items()}
        pending.clear()
        records = []
        for i, example in enumerate(inputs):
            records.append({
                "input": example, "prompt_ids": prompt_ids[i], "completion_ids": completion_ids[i],
                "completion": completions[i], "logprobs": None if logprobs is None else logprobs[i],
                "generation_logps": None if generation_logps is None else generation_logps[i].detach().cpu(),
                "extra_logs": {k: v[i] for k, v in extra_logs.items() if i < len(v)},
                "answers": {name: a[i] for name, a in answers.items() if i < len(a)},
            })
        return records, rewards_per_func

    def refill_batch(self):
        """The next local generation batch from a second iterator over the training set (restarted when spent)."""
        if self.iterator is None:
            self.dataloader = self.view.training_dataloader(self.refill_sampler)
            if self.skip:
                # A resumed run: move to where the interrupted one was. Creating a DataLoader iterator draws from the
                # global torch RNG, whose draws before the checkpoint are already in the state the checkpoint
                # restored, so the skipping runs on a forked RNG.
                with torch.random.fork_rng(devices=[]):
                    self.iterator = iter(self.dataloader)
                    for _ in range(self.skip):
                        self.next_refill()
                self.skip = 0
            else:
                self.iterator = iter(self.dataloader)
        self.drawn += 1
        return self.next_refill()

    def next_refill(self):
        try:
            return next(self.iterator)
        except StopIteration:
            self.iterator = iter(self.dataloader)
            return next(self.iterator)

    def refill_sampler(self, dataset):
        # TRL's sampler layout, each prompt batch once (TRL repeats it steps_per_generation x num_iterations times for
        # its buffered steps), and another seed so refills are not the main loop's prompts.
        return self.view.trl_sampler(dataset, repeat_count=1, seed=self.view.args.seed + 1)

    # ------------------------------------------------------------------ exchange and replay
    def exchange(self, order, rows, rewards, n_local):
        """Gather the selected rows so each process holds its slice `[rank * n_local, (rank + 1) * n_local)` of the
        final global batch, and build what `_generate` / `_calculate_rewards` replay."""
        t = self.view
        rank = t.accelerator.process_index
        mine = [(pos, rows[r][row - rank * n_local]) for pos, (r, row) in enumerate(order)
                if rank * n_local <= row < (rank + 1) * n_local]
        if t.accelerator.num_processes > 1:
            mine = gather_object(mine)  # one collective per generation batch: token ids and dataset columns only
        by_pos = dict(mine)
        local = [by_pos[pos] for pos in range(rank * n_local, (rank + 1) * n_local)]
        rewards_per_func = torch.stack([rewards[r][row] for r, row in order])
        extra_columns = sorted({k for rec in local for k in rec["extra_logs"]})
        pending = t.extra_log_columns()
        for column in extra_columns:
            pending[column].extend(rec["extra_logs"].get(column) for rec in local)
        logprobs = [rec["logprobs"] for rec in local]
        gen_logps = [rec["generation_logps"] for rec in local]
        device = t.accelerator.device
        generated = (
            [rec["prompt_ids"] for rec in local], [rec["completion_ids"] for rec in local], None,
            [rec["completion"] for rec in local], None if any(x is None for x in logprobs) else logprobs, {}, None, [],
        )
        names = sorted({k for rec in local for k in rec["answers"]})
        replay = {
            "generated": generated, "rewards_per_func": rewards_per_func,
            "generation_logps": None if any(x is None for x in gen_logps) else [x.to(device) for x in gen_logps],
            "answers": {name: [rec["answers"].get(name) for rec in local] for name in names},
        }
        return [rec["input"] for rec in local], replay

    def log(self, selection, groups_per_round: int):
        t = self.view
        generated = selection.rounds * groups_per_round
        t.queue_metrics({  # the same on every process: logged as they are
            "dynamic_sampling/rounds": (float(selection.rounds), 1.0),
            "dynamic_sampling/dropped_groups": (float(selection.dropped), 1.0),
            "dynamic_sampling/kept_frac": ((generated - selection.dropped) / generated, 1.0),
            "dynamic_sampling/filled_groups": (float(len(selection.filled)), 1.0),
        }, reduce=False)
        if selection.filled:
            t.warn_once(
                "dynamic_sampling_filled",
                f"dynamic_sampling: at step {t.state.global_step}, {selection.rounds} generation rounds found only "
                f"{len(selection.kept)} of {len(selection.groups)} groups whose rewards vary; the batch was filled "
                f"with {len(selection.filled)} groups that do not (they carry no GRPO advantage). Logged every step "
                "as dynamic_sampling/filled_groups; raise dynamic_sampling_max_rounds or use easier prompts. Warned "
                "once.",
            )

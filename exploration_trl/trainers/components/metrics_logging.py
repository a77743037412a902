"""The one way the package logs a metric (`ExplorationMetrics`, a component of the trainer): a `{name: (sum,
count)}` dict queued on the device (`trainer.queue_metrics`) and read at the next log, with TRL's own metrics, after one
reduce across processes and one device-to-host copy. Every method, component and callback logs this way.

It also computes the exploration metrics: pass@G and distinct completions per group from the rollout; entropy on
correct vs wrong completions, Λ(1..3), Λ(sample) and the branching factor from the loss pass TRL already runs; and it
gives the warnings that are decided from a metric's window, once per run (`WindowWarning`).
"""

from __future__ import annotations

import warnings

import torch

from ...ops.hashing import mix64
from ...ops.lm_head import metric_chunk_rows, token_statistics
from ...rewards.base import is_correct
from .collectives import gather_rows
from ...boundary.capture import Capture
from .metric_queue import MetricQueue
from .window_warning import WindowWarning
from .rollout import RolloutBatch

#: Pending device metrics are copied to the host at the next log, or once this many are waiting (e.g. with
#: `logging_strategy: no`), so that they never hold memory without bound.
MAX_PENDING_METRICS = 4096


class ExplorationMetrics:
    """The metric queue, the exploration metrics and the window warnings of one trainer."""

    #: What it reads of its trainer (`trainers/view.py`): the only names its view gives.
    READS = ("accelerator", "args", "lm_head", "metrics_window", "model", "rollout", "state",
             "strategies", "temperature")

    def __init__(self, view):
        self.view = view
        self.queue = MetricQueue()
        self.pending_advantages: list[torch.Tensor] = []
        self.given: set[str] = set()
        # A private generator keeps the global RNG (sampling, shuffling) exactly as TRL's.
        self.generator = torch.Generator().manual_seed(int(view.args.seed))

    # ------------------------------------------------------------------------------------------ the one idiom
    def add(self, metrics: dict, reduce: bool = True) -> None:
        """Queue `{name: (sum, count)}` (device scalars or numbers) for the next log; `reduce=False`: global already."""
        self.queue.add("train" if self.view.model.training else "eval", metrics, reduce)
        if len(self.queue) >= MAX_PENDING_METRICS:
            self.flush()

    def flush(self) -> None:
        """Append every queued metric's global mean to TRL's metric window (one reduce, one device-to-host copy).
        Collective: every process calls it (from `log`, which every process runs at the same steps)."""
        if not self.queue:
            return
        t = self.view

        def reduce_sum(x):
            return t.accelerator.reduce(x, reduction="sum") if t.accelerator.num_processes > 1 else x

        for mode, name, value in self.queue.drain(t.accelerator.device, reduce_sum):
            t.metrics_window(mode)[name].append(value)

    def warn_declared(self) -> None:
        """`warn` the trainer's declared warnings: the rollout's (which read the trainer) and its strategies' (which
        read the strategy's `MethodContext`, as the strategy itself does)."""
        t = self.view
        declared = [(w, t.rollout.view) for w in t.rollout.window_warnings]
        for strategy in t.strategies:
            declared.extend((w, strategy.ctx) for w in strategy.window_warnings)
        self.warn(declared)

    def warn(self, declared: list[tuple[WindowWarning, object]]) -> None:
        """Give each declared `WindowWarning` whose metric calls for it this window, once per run (the main process
        writes it; every process marks it given). Each comes with what its `message` and `applies` read."""
        t = self.view
        mode = "train" if t.model.training else "eval"
        window = t.metrics_window(mode)
        for w, reader in declared:
            values = window.get(w.metric) or []  # `.get`: reading adds no empty list for TRL to average
            if (w.metric in self.given or mode not in w.modes or not values or not w.when(values)
                    or not w.applies(reader)):
                continue
            self.given.add(w.metric)
            if t.accelerator.is_main_process:
                warnings.warn(w.message(reader, values), UserWarning, stacklevel=5)

    # ------------------------------------------------------------------------------- TRL's completions table
    def replace_logged_advantages(self, advantages: torch.Tensor, batch: RolloutBatch, maxlen: int | None):
        """TRL logs GRPO's advantages for its completions table (`log_completions`); show the final ones instead.
        Gathered now (a collective, at the same point on every process), written at the next log."""
        if advantages.dim() == 2:
            mask = batch.completion_mask.float()
            advantages = (advantages * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        pending = self.pending_advantages
        pending.append(gather_rows(advantages.float(), self.view.accelerator.num_processes))
        # Keep no more batches than TRL's deque can still show (it keeps the last `maxlen` values).
        while maxlen is not None and len(pending) > 1 and sum(x.numel() for x in pending[1:]) >= maxlen:
            pending.pop(0)

    def final_advantages(self, shown: int) -> list[float]:
        """The final advantages of the newest `shown` logged completions (and forget them)."""
        pending, self.pending_advantages = self.pending_advantages, []
        if not pending or not shown:
            return []
        return torch.cat(pending).tolist()[-shown:]

    # --------------------------------------------------------------------------------- exploration metrics
    @torch.no_grad()
    def rollout(self, batch: RolloutBatch):
        t = self.view
        if not t.args.exploration_metrics:
            return
        g = batch.num_generations
        correct = is_correct(batch.rewards, t.args.correct_reward_threshold).float().view(-1, g)
        # Distinct completions per group: a hash of each local completion's tokens, gathered, counted per group.
        hashes = completion_hashes(batch.completion_ids, batch.completion_mask)
        groups = gather_rows(hashes, t.accelerator.num_processes).view(-1, g)
        ordered = groups.sort(dim=1).values
        unique = (ordered[:, 1:] != ordered[:, :-1]).sum(dim=1) + 1
        # Both are global already (rewards and hashes of every process): logged as they are, not reduced again.
        self.add({
            "exploration/pass_at_G": (correct.max(dim=1).values.mean(), 1.0),
            "exploration/unique_completions_per_group": (unique.double().mean(), 1.0),
        }, reduce=False)

    def step_will_log(self) -> bool:
        """Whether the optimizer step in progress ends in a log (HF's `DefaultFlowCallback` rule).

        The LM-head statistics (Λ(n), branching factor) are computed only on such steps: their logged value is the
        logging step's, not an average over the logging window (the entropy split stays an average: it is free).
        """
        t = self.view
        args = t.args
        if not t.model.training or args.logging_strategy == "epoch":
            return True
        if args.logging_strategy == "no":
            return False
        step = t.state.global_step + 1
        every = t.state.logging_steps or args.logging_steps
        return step % max(int(every), 1) == 0 or (step == 1 and args.logging_first_step)

    @torch.no_grad()
    def tokens(self, inputs, capture: Capture, mask: torch.Tensor) -> dict:
        """Exploration metrics from the loss pass TRL already ran (no extra backbone pass), kept on the device."""
        entropies = capture.entropies.detach().float()
        correct = inputs.get("exploration_correct")
        stats: dict[str, tuple] = {}
        if correct is not None:
            for name, rows in (("correct", correct), ("wrong", ~correct)):
                m = mask & rows[:, None]
                stats[f"exploration/entropy_{name}"] = ((entropies * m).sum(), m.sum(dtype=torch.float32))
        if self.step_will_log():  # the same decision on every process: global_step is shared
            stats.update(self.lm_head(inputs, capture, mask))
        return stats

    def lm_head(self, inputs, capture: Capture, mask: torch.Tensor) -> dict:
        """Λ(1..3), Λ(sample) and the branching factor over sampled completion tokens (or every token per response).

        One host read: the number of valid tokens (`nonzero`), which sizes the sample.
        """
        t = self.view
        positions = mask.nonzero(as_tuple=False)
        per_response = t.args.exploration_metrics_lambda == "per_response"
        k = positions.size(0) if per_response else min(t.args.exploration_metrics_max_tokens, positions.size(0))
        pick = torch.randperm(positions.size(0), generator=self.generator)[:k]
        pick = pick.to(positions.device, non_blocking=True)
        rows, cols = positions[pick, 0], positions[pick, 1]
        hidden = capture.completion_hidden().detach()[rows, cols]
        targets = inputs["completion_ids"][rows, cols]
        with t.lm_head.weights() as (weight, bias, _):  # entered on every process, even with k = 0
            s = token_statistics(
                hidden, weight, bias, targets, temperature=t.temperature, top_n=3,
                top_p=t.args.exploration_metrics_top_p, chunk_rows=metric_chunk_rows(weight.shape[0]),
                entropy=False,
            )
        names = ("lambda_1", "lambda_2", "lambda_3", "lambda_sample", "branching_factor")
        if k == 0:
            return {f"exploration/{name}": (0.0, 0.0) for name in names}
        # sampled_tokens: (sum, count) over the k tokens; per_response: (sum of the responses' means, responses).
        columns = [s["topn_logps"][:, n].float() for n in range(3)] + [s["target_logps"].float(),
                                                                       s["branching"].float()]
        if per_response:
            return {f"exploration/{name}": per_response_sum(v, rows, mask.size(0)) for name, v in zip(names, columns)}
        return {f"exploration/{name}": (v.sum(), float(k)) for name, v in zip(names, columns)}


def per_response_sum(values: torch.Tensor, rows: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(sum over responses of the mean of their values, number of responses with a value)`, device scalars: CaSP
    Eq. 2's Λ(n) is the mean over a response's tokens, then over the responses; the pair is reduced across processes
    like the others."""
    sums = torch.zeros(num_rows, dtype=torch.float64, device=values.device).index_add_(0, rows, values.double())
    counts = torch.zeros(num_rows, dtype=torch.float64, device=values.device).index_add_(
        0, rows, torch.ones_like(rows, dtype=torch.float64))
    has = counts > 0
    return torch.where(has, sums / counts.clamp(min=1.0), 0.0).sum(), has.sum()


def completion_hashes(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(B,)` int64 hash of each completion's valid tokens (position-aware), computed on the device.

    Equal completions hash equally; distinct ones collide with probability ~2^-64 per pair. Integer arithmetic
    wraps identically on every device, so processes agree.
    """
    positions = torch.arange(ids.size(1), device=ids.device, dtype=torch.int64)
    token = mix64(ids.to(torch.int64) * (1 << 20 | 1) + mix64(positions))
    return (token * (mask != 0)).sum(dim=1)

"""Exploration metrics of `ExplorationGRPOTrainer` (`ExplorationMetricsMixin`), logged with TRL's own metrics:
pass@G and distinct completions per group from the rollout; entropy on correct vs wrong completions, Λ(1..3),
Λ(sample) and the branching factor from the loss pass TRL already runs.

No metric reads the device on a training step: each value stays a device tensor until the step that logs, where all
of them are reduced across processes and copied to the host together (`_flush_device_metrics`, one transfer).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..ops.hashing import mix64
from ..ops.lm_head import metric_chunk_rows, token_statistics
from ..rewards._base import is_correct
from .capture import _Capture
from .metric_queue import MetricQueue
from .rollout import RolloutBatch

#: Pending device metrics are copied to the host at the next log, or once this many are waiting (e.g. with
#: `logging_strategy: no`), so that they never hold memory without bound.
MAX_PENDING_METRICS = 4096


def _some_positive(values: list[float]) -> bool:
    return any(v > 0 for v in values)


@dataclass(frozen=True)
class WindowWarning:
    """A warning given once per run, at a logging step, when one metric's values over the logging window call for
    it. It is read with the other metrics at the log (no host read of its own). A trainer class declares its
    own in `window_warnings`; `message(trainer, values)` writes the text."""

    metric: str
    message: Callable[[Any, list[float]], str]
    when: Callable[[list[float]], bool] = _some_positive


class ExplorationMetricsMixin:
    """Metric logging; every value is reduced across processes, so all processes log alike."""

    def _replace_logged_advantages(self, advantages: torch.Tensor, batch: RolloutBatch):
        """TRL logs GRPO's advantages in `_logs["advantages"]` for its completions table; show the final ones
        instead. Gathered now (a collective, at the same point on every process), read at the next log.

        TRL reads `_logs` only when `log_completions` is on (its `log`), so otherwise nothing is done."""
        if not self.log_completions:
            return
        if advantages.dim() == 2:
            mask = batch.completion_mask.float()
            advantages = (advantages * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        pending = self.__dict__.setdefault("_pending_logged_advantages", [])
        pending.append(self._gather(advantages.float()))
        # Keep no more batches than TRL's deque can still show (it keeps the last `maxlen` values).
        maxlen = self._logs["advantages"].maxlen
        while maxlen is not None and len(pending) > 1 and sum(t.numel() for t in pending[1:]) >= maxlen:
            pending.pop(0)

    def _write_logged_advantages(self):
        """Replace the newest values of TRL's advantage log by the final advantages of the same completions (TRL
        added one value per completion of each batch, in the same order)."""
        pending = self.__dict__.pop("_pending_logged_advantages", None)
        if not pending:
            return
        logged = self._logs["advantages"]
        final = torch.cat(pending).tolist()[-len(logged):] if logged else []
        for _ in range(len(final)):
            logged.pop()
        logged.extend(final)

    @torch.no_grad()
    def _log_rollout_metrics(self, batch: RolloutBatch):
        if not self.args.exploration_metrics:
            return
        g = batch.num_generations
        correct = is_correct(batch.rewards, self.args.correct_reward_threshold).float().view(-1, g)
        # Distinct completions per group: a hash of each local completion's tokens, gathered, counted per group.
        groups = self._gather(completion_hashes(batch.completion_ids, batch.completion_mask)).view(-1, g)
        ordered = groups.sort(dim=1).values
        unique = (ordered[:, 1:] != ordered[:, :-1]).sum(dim=1) + 1
        # Both are global already (rewards and hashes of every process): logged as they are, not reduced again.
        self._log_device_metrics({
            "exploration/pass_at_G": (correct.max(dim=1).values.mean(), 1.0),
            "exploration/unique_completions_per_group": (unique.double().mean(), 1.0),
        }, reduce=False)

    def _log_loss_state_metrics(self, state: dict, defer: bool = False):
        """Log `state["metrics"]` (name -> (sum, count), floats or device scalars) as global means, as TRL's
        `global_masked_mean` does; a name with no element on any process (count 0, e.g. `exploration/entropy_correct`
        without a correct completion) is not logged that step rather than logged as NaN.

        `defer=True` (the loss side) keeps the values on the device until the next log (`_flush_device_metrics`);
        otherwise they reach `_metrics` now (one reduce and one transfer).
        """
        metrics = state.get("metrics")
        if not metrics:
            return
        self._log_device_metrics(metrics)
        if not defer:
            self._flush_device_metrics()

    def _log_device_metrics(self, metrics: dict, reduce: bool = True):
        """Queue `{name: (sum, count)}` (device scalars or numbers) for the next log; `reduce=False`: global already."""
        queue = self.__dict__.setdefault("_metric_queue", MetricQueue())
        queue.add("train" if self.model.training else "eval", metrics, reduce)
        if len(queue) >= MAX_PENDING_METRICS:
            self._flush_device_metrics()

    def _flush_device_metrics(self):
        """Append every queued metric's global mean to TRL's `_metrics` (one reduce, one device-to-host copy).
        Collective: every process calls it (from `log`, which every process runs at the same steps)."""
        queue = self.__dict__.get("_metric_queue")
        if not queue:
            return

        def reduce_sum(x):
            return self.accelerator.reduce(x, reduction="sum") if self.accelerator.num_processes > 1 else x

        for mode, name, value in queue.drain(self.accelerator.device, reduce_sum):
            self._metrics[mode][name].append(value)

    #: The warnings this class adds (`WindowWarning`); a trainer gives those of every class in its MRO.
    window_warnings: tuple[WindowWarning, ...] = ()

    def _issue_window_warnings(self) -> None:
        """Give each declared `WindowWarning` whose metric calls for it this window, once per run (the main process
        writes it; every process marks it given)."""
        mode = "train" if self.model.training else "eval"
        given = self.__dict__.setdefault("_given_warnings", set())
        declared = [w for cls in type(self).__mro__ for w in cls.__dict__.get("window_warnings", ())]
        for w in declared:
            values = self._metrics[mode].get(w.metric) or []  # `.get`: reading adds no empty list for TRL to average
            if w.metric in given or not values or not w.when(values):
                continue
            given.add(w.metric)
            if self.accelerator.is_main_process:
                warnings.warn(w.message(self, values), UserWarning, stacklevel=3)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        self._flush_device_metrics()  # TRL's `log` averages `_metrics`: the queued values must be in it
        self._issue_window_warnings()
        self._write_logged_advantages()  # and prints `_logs` (with `log_completions`)
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial) -> None:
        # A checkpoint keeps the logging window's `_metrics` (`ResumeMixin._resume_state`), so a resumed run logs the
        # same averages: the queued values go into it first. Every process saves, so the collective is safe here.
        self._flush_device_metrics()
        super()._save_checkpoint(model, trial)

    def _step_will_log(self) -> bool:
        """Whether the optimizer step in progress ends in a log (HF's `DefaultFlowCallback` rule).

        The LM-head statistics (Λ(n), branching factor) are computed only on such steps: their logged value is the
        logging step's, not an average over the logging window (the entropy split stays an average: it is free).
        """
        args = self.args
        if not self.model.training or args.logging_strategy == "epoch":
            return True
        if args.logging_strategy == "no":
            return False
        step = self.state.global_step + 1
        every = self.state.logging_steps or args.logging_steps
        return step % max(int(every), 1) == 0 or (step == 1 and args.logging_first_step)

    @torch.no_grad()
    def _log_token_metrics(self, inputs, capture: _Capture):
        """Exploration metrics from the loss pass TRL already ran (no extra backbone pass), kept on the device."""
        self._mark_hook_ran("exploration metrics")
        mask = self._loss_mask(inputs).bool()
        entropies = capture.entropies.detach().float()
        correct = inputs.get("exploration_correct")
        stats: dict[str, tuple] = {}
        if correct is not None:
            for name, rows in (("correct", correct), ("wrong", ~correct)):
                m = mask & rows[:, None]
                stats[f"exploration/entropy_{name}"] = ((entropies * m).sum(), m.sum(dtype=torch.float32))
        if self._step_will_log():  # the same decision on every process: global_step is shared
            stats.update(self._lm_head_metrics(inputs, capture, mask))
        self._log_loss_state_metrics({"metrics": stats}, defer=True)

    def _lm_head_metrics(self, inputs, capture: _Capture, mask: torch.Tensor) -> dict:
        """Λ(1..3), Λ(sample) and the branching factor over sampled completion tokens (or every token per response).

        One host read: the number of valid tokens (`nonzero`), which sizes the sample.
        """
        positions = mask.nonzero(as_tuple=False)
        per_response = self.args.exploration_metrics_lambda == "per_response"
        k = positions.size(0) if per_response else min(self.args.exploration_metrics_max_tokens, positions.size(0))
        # A private generator keeps the global RNG (sampling, shuffling) exactly as TRL's.
        pick = torch.randperm(positions.size(0), generator=self._metrics_generator)[:k]
        pick = pick.to(positions.device, non_blocking=True)
        rows, cols = positions[pick, 0], positions[pick, 1]
        hidden = capture.completion_hidden().detach()[rows, cols]
        targets = inputs["completion_ids"][rows, cols]
        with self._lm_head_weights() as (weight, bias, _):  # entered on every process, even with k = 0
            s = token_statistics(
                hidden, weight, bias, targets, temperature=self.temperature, top_n=3,
                top_p=self.args.exploration_metrics_top_p, chunk_rows=metric_chunk_rows(weight.shape[0]),
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

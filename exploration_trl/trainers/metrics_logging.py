"""Exploration metrics of `ExplorationGRPOTrainer` (`ExplorationMetricsMixin`), logged with TRL's own metrics:
pass@G and distinct completions per group from the rollout; entropy on correct vs wrong completions, Λ(1..3),
Λ(sample) and the branching factor from the loss pass TRL already runs."""

from __future__ import annotations

import torch

from ..ops.lm_head import token_statistics
from ..rewards._base import is_correct
from .capture import _Capture
from .rollout import RolloutBatch


class ExplorationMetricsMixin:
    """Metric logging; every value is reduced across processes, so all processes log alike."""

    def _replace_logged_advantages(self, advantages: torch.Tensor, batch: RolloutBatch):
        """TRL logs GRPO's advantages in `_logs["advantages"]`; show the final ones instead."""
        if advantages.dim() == 2:
            mask = batch.completion_mask.float()
            advantages = (advantages * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        final = self._gather(advantages.float()).tolist()
        logged = self._logs["advantages"]
        for _ in range(min(len(final), len(logged))):
            logged.pop()
        logged.extend(final)

    @torch.no_grad()
    def _log_rollout_metrics(self, batch: RolloutBatch):
        if not self.args.exploration_metrics:
            return
        mode = "train" if self.model.training else "eval"
        g = batch.num_generations
        correct = is_correct(batch.rewards, self.args.correct_reward_threshold).float().view(-1, g)
        self._metrics[mode]["exploration/pass_at_G"].append(correct.max(dim=1).values.mean().item())
        # Distinct completions per group: hash each local completion's token ids, then gather.
        ids, mask = batch.completion_ids, batch.completion_mask
        hashes = torch.tensor(
            [hash(tuple(row[m.bool()].tolist())) for row, m in zip(ids, mask, strict=True)],
            dtype=torch.int64, device=ids.device,
        )
        groups = self._gather(hashes).view(-1, g)
        unique = sum(len(set(row.tolist())) for row in groups) / groups.size(0)
        self._metrics[mode]["exploration/unique_completions_per_group"].append(unique)

    def _log_loss_state_metrics(self, state: dict):
        """Log `state["metrics"]` (name -> (sum, count)) as global means, as TRL's `global_masked_mean` does; a name
        with no element on any process (count 0, e.g. `exploration/entropy_correct` without a correct completion) is
        not logged that step rather than logged as NaN."""
        metrics = state.get("metrics")
        if not metrics:
            return
        mode = "train" if self.model.training else "eval"
        names = sorted(metrics)
        local = torch.tensor([v for n in names for v in metrics[n]], dtype=torch.float32, device=self.accelerator.device)
        totals = self.accelerator.reduce(local, reduction="sum").view(-1, 2)
        for name, (total, count) in zip(names, totals.tolist(), strict=True):
            if count > 0:  # decided from the reduced count, so every process skips alike (e.g. no correct completion)
                self._metrics[mode][name].append(total / count)

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
        """Exploration metrics from the loss pass TRL already ran (no extra backbone pass)."""
        self._mark_hook_ran("exploration metrics")
        mask = self._loss_mask(inputs).bool()
        entropies = capture.entropies.detach().float()
        correct = inputs.get("exploration_correct")
        stats: dict[str, tuple[float, float]] = {}
        if correct is not None:
            for name, rows in (("correct", correct), ("wrong", ~correct)):
                m = mask & rows[:, None]
                stats[f"exploration/entropy_{name}"] = ((entropies * m).sum().item(), m.sum().item())
        if not self._step_will_log():  # the same decision on every process: global_step is shared
            self._log_loss_state_metrics({"metrics": stats})
            return

        positions = mask.nonzero(as_tuple=False)
        per_response = self.args.exploration_metrics_lambda == "per_response"
        k = positions.size(0) if per_response else min(self.args.exploration_metrics_max_tokens, positions.size(0))
        # A private generator keeps the global RNG (sampling, shuffling) exactly as TRL's.
        pick = torch.randperm(positions.size(0), generator=self._metrics_generator)[:k].to(positions.device)
        rows, cols = positions[pick, 0], positions[pick, 1]
        hidden = capture.completion_hidden().detach()[rows, cols]
        targets = inputs["completion_ids"][rows, cols]
        with self._lm_head_weights() as (weight, bias, _):  # entered on every process, even with k = 0
            # Small row chunks keep the float64 vocabulary buffers of the top-p count small.
            s = token_statistics(
                hidden, weight, bias, targets, temperature=self.temperature, top_n=3,
                top_p=self.args.exploration_metrics_top_p, chunk_rows=16, entropy=False,
            )
        if k > 0:
            # sampled_tokens: (sum, count) over the k tokens; per_response: (sum of the responses' means, responses).
            average = (lambda v: per_response_sum(v, rows, mask.size(0))) if per_response else (
                lambda v: (v.sum().item(), float(k)))
            for n in range(3):
                stats[f"exploration/lambda_{n + 1}"] = average(s["topn_logps"][:, n].float())
            stats["exploration/lambda_sample"] = average(s["target_logps"].float())
            stats["exploration/branching_factor"] = average(s["branching"].float())
        else:
            for name in ("lambda_1", "lambda_2", "lambda_3", "lambda_sample", "branching_factor"):
                stats[f"exploration/{name}"] = (0.0, 0.0)
        self._log_loss_state_metrics({"metrics": stats})


def per_response_sum(values: torch.Tensor, rows: torch.Tensor, num_rows: int) -> tuple[float, float]:
    """`(sum over responses of the mean of their values, number of responses with a value)`: CaSP Eq. 2's Λ(n) is the
    mean over a response's tokens, then over the responses; the pair is reduced across processes like the others."""
    sums = torch.zeros(num_rows, dtype=torch.float64, device=values.device).index_add_(0, rows, values.double())
    counts = torch.bincount(rows, minlength=num_rows).to(torch.float64)
    has = counts > 0
    return (sums[has] / counts[has]).sum().item(), float(has.sum().item())


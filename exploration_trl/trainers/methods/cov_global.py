"""`cov_selection: global` for KL-Cov and Clip-Cov: the covariance tokens chosen over the whole optimizer step.

The official code (and `cov_selection: local`, the default) picks the top-covariance tokens inside each process's
micro-batch, which the authors call an approximation of the global choice. With `global`, on the first micro-batch
of each optimizer step every process runs one no-grad forward over the step's micro-batches (TRL has buffered them
all: `_buffered_inputs`), the means of log-prob and advantage are reduced over every valid token of the step and of
every process, each token's covariance is formed with those means (`core.token_covariance(means=...)`), and the
selection is made over the global set:

* KL-Cov: the `max(1, int(N * kl_cov_ratio))` tokens with the largest covariance of the `N` valid tokens of the
  step (ties at the threshold are all kept);
* Clip-Cov: `max(1, int(N * clip_cov_ratio))` of the step's candidates (not PPO-clipped, covariance inside the
  window) drawn uniformly at random. Each token gets an integer key hashed from (seed, global step, the
  completion's row in the generation batch, the token's position) on the device (`ops.hashing.unique_keys`), so
  the draw does not depend on how rows are split over processes and micro-batches; the candidates with the
  smallest keys are cut. The keys are distinct integers, so exactly that many are cut.

Only the k best values of each process travel (a gather of k values, in their own dtype), never the whole batch, and
the k-th best stays on the device. The per-token terms are then applied per micro-batch exactly as with `local`.
Host reads per optimizer step: one per micro-batch (its valid tokens, for the step's means) and one for the counts
that size the selection. The cost is the added forward (see `docs/`).
"""

from __future__ import annotations

import torch

from ...core import losses as core_loss
from ...core.utils import as_valid, broadcast_advantages
from ..config import check_choice
from ..components.rollout import MULTIMODAL_KEYS

COV_SELECTIONS = ("local", "global")


def check_cov_selection(config):
    check_choice(config, "cov_selection", COV_SELECTIONS)
    if config.cov_selection == "global":
        spg, ga = config.steps_per_generation, config.gradient_accumulation_steps
        if spg is not None and spg % ga != 0:
            raise ValueError(f"cov_selection: global needs steps_per_generation ({spg}) to be a multiple of "
                             f"gradient_accumulation_steps ({ga}), so that an optimizer step's micro-batches all "
                             "come from one generation batch; change steps_per_generation or use cov_selection: local")


class GlobalCovSelection:
    """One KL-Cov / Clip-Cov strategy's step-wide selection (module docstring). `select(terms, covs, n)` is the
    method's own rule: the step's masks from every micro-batch's terms, covariances and the step's valid tokens."""

    def __init__(self, ctx, select):
        self.ctx = ctx
        self.select = select
        self.step_masks: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def active(self) -> bool:
        return self.ctx.training and self.ctx.args.cov_selection == "global"

    def prepare(self, model) -> None:
        """On a step's first micro-batch: one no-grad forward over the step's micro-batches, then the selection."""
        if self.ctx.micro_step() in self.step_masks:
            return
        steps, micro = self.ctx.step_micro_batches()
        with torch.no_grad():
            logps = [self.current_logps(model, inp) for inp in micro]
        terms = [self.terms(inp, lp) for inp, lp in zip(micro, logps, strict=True)]
        dev = logps[0].device
        local = torch.zeros(3, dtype=torch.float64, device=dev)
        for lp, a, valid in ((t_["lp"], t_["a"], t_["valid"]) for t_ in terms):
            at = valid.reshape(-1).nonzero().squeeze(1)  # a host read: the sums below add exactly these tokens
            local += torch.stack([lp.reshape(-1)[at].double().sum(), a.reshape(-1)[at].double().sum(),
                                  valid.sum().double()])
        total = self.ctx.sum_over_processes(local)
        count = total[2].clamp(min=1.0)
        means = ((total[0] / count).float(), (total[1] / count).float())
        covs = [core_loss.token_covariance(t_["lp"], t_["a"], t_["valid"], means=means) for t_ in terms]
        selected = self.select(terms, covs, total[2])
        self.step_masks = {s: (sel, cov) for s, sel, cov in zip(steps, selected, covs, strict=True)}

    def for_inputs(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`(selected, cov)` of the micro-batch now in the loss, or None under `cov_selection: local` / eval."""
        if not self.active:
            return None
        return self.step_masks[self.ctx.micro_step()]

    def current_logps(self, model, inp) -> torch.Tensor:
        """The current policy's log-probs of one buffered micro-batch, as TRL's `_compute_loss` computes them."""
        input_ids = torch.cat([inp["prompt_ids"], inp["completion_ids"]], dim=1)
        attention_mask = torch.cat([inp["prompt_mask"], inp["completion_mask"]], dim=1)
        logps, _, _ = self.ctx.forward_logps(
            model, input_ids, attention_mask, inp["completion_ids"].size(1),
            **{k: inp[k] for k in MULTIMODAL_KEYS if k in inp},
        )
        return logps

    def terms(self, inp, lp: torch.Tensor) -> dict:
        valid = as_valid(self.ctx.loss_mask(inp))
        return {"lp": lp.float(), "a": broadcast_advantages(inp["advantages"], lp.shape).float(), "valid": valid,
                "inputs": inp}

    def global_kth(self, values: torch.Tensor, k: int, largest: bool) -> torch.Tensor:
        return _global_kth(self.ctx, values, k, largest)


def _global_kth(ctx, values: torch.Tensor, k: int, largest: bool) -> torch.Tensor:
    """The k-th largest (smallest) of `values` over every process of the run (`ctx`), a device scalar: each
    process sends only its own k best (padded with the dtype's extreme, which never reaches the k-th place while k <=
    the number of real values over all processes), in `values`' own dtype."""
    fill = _extreme(values.dtype, lowest=largest)
    mine = torch.topk(values, min(k, values.numel()), largest=largest).values
    mine = torch.cat([mine, mine.new_full((k - mine.numel(),), fill)])[None]
    every = ctx.gather_rows(mine).reshape(-1)
    return torch.topk(every, k, largest=largest).values[-1]


def _extreme(dtype: torch.dtype, lowest: bool):
    if dtype.is_floating_point:
        return -float("inf") if lowest else float("inf")
    info = torch.iinfo(dtype)
    return info.min if lowest else info.max

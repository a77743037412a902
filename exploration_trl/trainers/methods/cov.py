"""KL-Cov and Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"), as its official code."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ...core import losses as core_loss
from ...core.utils import broadcast_advantages
from ...methods import MethodInfo, arxiv_paper, register_method
from ...ops.hashing import ID_BITS, stream, unique_keys
from ..base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch, check_non_negative
from ...boundary.capture import Capture
from .cov_global import GlobalCovSelection, check_cov_selection
from ..components.window_warning import WindowWarning
from ..strategy import LossStrategy

#: Per micro-batch, 1 when Clip-Cov selected no token (no covariance inside its window).
NO_SELECTION = "clip_cov/no_selection_frac"

#: The paper behind both methods.
ENTROPY_MECHANISM = arxiv_paper(
    "cui2025entropy", "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", "Cui et al., 2025",
    ["Ganqu Cui", "Yuchen Zhang", "Jiacheng Chen", "Lifan Yuan", "Zhi Wang", "Yuxin Zuo", "Haozhan Li", "Yuchen Fan",
     "Huayu Chen", "Weize Chen", "Zhiyuan Liu", "Hao Peng", "Lei Bai", "Wanli Ouyang", "Yu Cheng", "Bowen Zhou",
     "Ning Ding"], 2025, "2505.22617")
#: The published KL-Cov / Clip-Cov recipes run 8 optimizer updates per rollout (256 prompts, verl mini-batch 32).
DEFAULT_UPDATES_PER_ROLLOUT = 8


def _default_updates_per_rollout(config):
    if config.steps_per_generation is None and config.generation_batch_size is None:
        config.steps_per_generation = DEFAULT_UPDATES_PER_ROLLOUT * config.gradient_accumulation_steps


_COV_SELECTION_HELP = (
    "Where the top-covariance tokens are chosen: 'local' (default; within each process's micro-batch, as the official "
    "code, no added cost) or 'global' (over every micro-batch of the optimizer step and every process: the same "
    "tokens whatever the number of processes, for one added no-grad forward per step; see "
    "trainers/methods/cov_global.py)."
)


def _cov_metrics(prefix: str, selected: torch.Tensor, cov: torch.Tensor) -> dict:
    """Selected tokens and the smallest selected covariance, as device scalars (read at the next log)."""
    n = selected.sum(dtype=torch.float32)
    has = n.clamp(max=1.0)  # 1 when a token was selected, else 0 (the threshold is then not logged)
    lowest = torch.where(selected, cov, float("inf")).amin() if selected.numel() else cov.new_zeros(())
    return {f"{prefix}/selected_tokens": (n, 1.0), f"{prefix}/cov_threshold": (torch.where(n > 0, lowest, 0.0), has)}


@dataclass
class KLCovConfig(ExplorationGRPOConfig):
    """KL-Cov: no ratio clipping, plus `kl_cov_coef * |logp - old_logp|` on the `kl_cov_ratio` fraction of tokens
    with the largest log-prob/advantage covariance. The penalty only acts when a rollout feeds several optimizer
    steps, so by default each rollout is split into 8 optimizer steps (`steps_per_generation = 8 x
    gradient_accumulation_steps`), as the published recipes (256 prompts, mini-batch 32)."""

    kl_cov_ratio: float = field(
        default=0.002,
        metadata={"help": "Fraction of tokens that get the KL penalty. Each rollout feeds 8 optimizer updates by "
                  "default (steps_per_generation = 8 x gradient_accumulation_steps), as the published recipes."},
    )
    kl_cov_coef: float = field(default=1.0, metadata={"help": "Weight of the |logp - old_logp| penalty."})
    epsilon: float = field(default=math.inf, metadata={"help": "KL-Cov uses no ratio clipping."})
    epsilon_high: float | None = field(default=math.inf, metadata={"help": "KL-Cov uses no ratio clipping."})
    cov_selection: str = field(default="local", metadata={"help": _COV_SELECTION_HELP})

    def __post_init__(self):
        _default_updates_per_rollout(self)
        super().__post_init__()
        check_cov_selection(self)
        check_non_negative(self, {"kl_cov_coef": "the weight of the |logp - old_logp| penalty (paper: 1.0)"})
        if not 0.0 <= self.kl_cov_ratio <= 1.0:
            raise ValueError(f"kl_cov_ratio is a fraction in [0, 1], got {self.kl_cov_ratio}")


@register_method(MethodInfo(
    name="kl_cov", side="loss", display="KL-Cov",
    summary="KL-Cov: |logp - old_logp| penalty on the highest-covariance tokens",
    description="A KL penalty on the small fraction of tokens with the largest covariance between log-probability "
                "and advantage, which would otherwise drive entropy collapse.",
    paper=ENTROPY_MECHANISM, config_prefixes=("kl_cov_",), metric_prefixes=("kl_cov/",),
    coefficients={"kl_cov_coef": 1, "kl_cov_ratio": 1}, published={"kl_cov_ratio": 0.002, "kl_cov_coef": 1.0},
    where="official code",
    changes=("no ratio clipping; `coef·|logp − old|` on the top `ratio` tokens by log-prob/advantage covariance; **8 "
             "optimizer updates per rollout** (the published recipes: 256 prompts, mini-batch 32), without which the "
             "penalty has no gradient (a warning says so)"),
    knobs_note="(and `steps_per_generation=8×grad_accum`)",
))
class KLCov(LossStrategy):
    """Loss-side: adds the KL-Cov penalty as an extra per-token term, aggregated like TRL's loss."""

    config_class = KLCovConfig

    def __init__(self, ctx):
        super().__init__(ctx)
        self.global_selection = GlobalCovSelection(ctx, self._cov_select_global)
        if ctx.updates_per_rollout() <= 1 and self.args.kl_cov_ratio > 0:
            ctx.warn_once(
                "kl_cov_single_update",
                "kl_cov: every rollout feeds a single optimizer update (steps_per_generation x num_iterations = "
                "gradient_accumulation_steps), so old log-probs equal current ones, |logp - old_logp| has no gradient "
                "and KL-Cov trains as unclipped GRPO. Leave steps_per_generation unset (8 x gradient_accumulation_steps, "
                "as the published recipes) or set num_iterations > 1.",
            )

    def before_loss(self, model, inputs) -> None:
        if self.global_selection.active:
            self.global_selection.prepare(model)

    def extra_loss(self, inputs, capture: Capture, state):
        ctx = self.ctx
        logps = capture.logps
        mask = ctx.loss_mask(inputs)
        old = ctx.old_logps(inputs, logps)
        advantages = broadcast_advantages(inputs["advantages"], logps.shape)
        chosen = self.global_selection.for_inputs()
        if chosen is None:
            selected = core_loss.kl_cov_select(logps.detach(), advantages, mask, self.args.kl_cov_ratio)
            cov = core_loss.token_covariance(logps.detach(), advantages, mask)
        else:
            selected, cov = chosen
        ctx.queue_metrics(_cov_metrics("kl_cov", selected, cov))
        return self.args.kl_cov_coef * selected.float() * (logps - old).abs()

    def _cov_select_global(self, terms: list[dict], covs: list[torch.Tensor], n: torch.Tensor) -> list[torch.Tensor]:
        """KL-Cov over the step: the `max(1, int(N * kl_cov_ratio))` largest covariances of all N valid tokens."""
        ratio = self.args.kl_cov_ratio
        n = int(n.item()) if ratio > 0 else 0  # the host read that sizes the selection
        if n == 0:
            return [torch.zeros_like(t["valid"]) for t in terms]
        k = min(max(1, int(n * ratio)), n)
        # Padding holds -inf, so it never enters the k largest of the N >= k valid covariances.
        values = torch.cat([torch.where(t["valid"], c, -float("inf")).reshape(-1) for c, t in zip(covs, terms,
                                                                                                  strict=True)])
        threshold = self.global_selection.global_kth(values, k, largest=True)
        return [t["valid"] & (c >= threshold) for c, t in zip(covs, terms, strict=True)]


class KLCovTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with the KL-Cov penalty (the `KLCov` strategy)."""

    method = "kl_cov"


@dataclass
class ClipCovConfig(ExplorationGRPOConfig):
    """Clip-Cov: a random `clip_cov_ratio` fraction of tokens with covariance in (`clip_cov_lb`, `clip_cov_ub`)
    lose their gradient. As in the official recipes, both clip ratios are 1 (a ratio range of [0, 2]): the random
    covariance detaching replaces PPO's clipping, and each rollout feeds 8 optimizer updates."""

    clip_cov_ratio: float = field(default=2e-4, metadata={"help": "Fraction of tokens whose gradient is cut."})
    epsilon: float = field(default=1.0, metadata={"help": "Lower clip: ratio >= 1 - epsilon (recipes: 1)."})
    epsilon_high: float | None = field(default=1.0, metadata={"help": "Upper clip: ratio <= 1 + epsilon_high "
                                                                       "(recipes: 1)."})
    clip_cov_lb: float = field(default=1.0, metadata={"help": "Lower covariance bound for candidates."})
    clip_cov_ub: float = field(default=5.0, metadata={"help": "Upper covariance bound for candidates."})
    cov_selection: str = field(default="local", metadata={"help": _COV_SELECTION_HELP})

    def __post_init__(self):
        _default_updates_per_rollout(self)
        super().__post_init__()
        check_cov_selection(self)
        if not 0.0 <= self.clip_cov_ratio <= 1.0:
            raise ValueError(f"clip_cov_ratio is a fraction in [0, 1], got {self.clip_cov_ratio}")
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb ({self.clip_cov_lb}) must be < clip_cov_ub ({self.clip_cov_ub})")


@register_method(MethodInfo(
    name="clip_cov", side="loss", display="Clip-Cov",
    summary="Clip-Cov: a random share of high-covariance tokens loses its gradient",
    description="The policy gradient of a small random subset of high-covariance tokens is cut, slowing entropy "
                "collapse.",
    paper=ENTROPY_MECHANISM, config_prefixes=("clip_cov_",), metric_prefixes=("clip_cov/",),
    coefficients={"clip_cov_ratio": 1}, published={"clip_cov_ratio": 2e-4},
    where="official code",
    changes=("a random `ratio` fraction of tokens with covariance in (lb, ub) loses its gradient; both clip ratios 1 "
             "(ratio range [0, 2]) as the recipes, the detaching replaces PPO clipping; a step that selects no token "
             "is logged (`clip_cov/no_selection_frac`) and warned about once"),
    knobs_note="(and `steps_per_generation=8×grad_accum`)",
))
class ClipCov(LossStrategy):
    """Loss-side: detaches the selected tokens' log-probs, so TRL's clipped loss has zero gradient there."""

    config_class = ClipCovConfig
    window_warnings = (WindowWarning(NO_SELECTION, lambda ctx, values: _no_selection(ctx),
                                     applies=lambda ctx: ctx.args.clip_cov_ratio > 0),)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.global_selection = GlobalCovSelection(ctx, self._cov_select_global)
        self._clip_cov_generator = torch.Generator().manual_seed(int(self.args.seed) + 1)

    def generators(self) -> dict[str, torch.Generator]:
        return {"_clip_cov_generator": self._clip_cov_generator}  # the name checkpoints since 0.3 hold

    def before_loss(self, model, inputs) -> None:
        if self.global_selection.active:
            self.global_selection.prepare(model)

    def transform_logps(self, logps, capture: Capture, inputs, state):
        ctx, args = self.ctx, self.args
        mask = ctx.loss_mask(inputs)
        old = ctx.old_logps(inputs, logps)
        advantages = broadcast_advantages(inputs["advantages"], logps.shape)
        chosen = self.global_selection.for_inputs()
        if chosen is None:
            selected = core_loss.clip_cov_select(
                logps.detach(), old, advantages, mask, args.clip_cov_ratio, args.clip_cov_lb, args.clip_cov_ub,
                ctx.epsilon_low, ctx.epsilon_high, generator=self._clip_cov_generator,
            )
            cov = core_loss.token_covariance(logps.detach(), advantages, mask)
        else:
            selected, cov = chosen
        metrics = _cov_metrics("clip_cov", selected, cov)
        metrics[NO_SELECTION] = (1.0 - metrics["clip_cov/cov_threshold"][1], 1.0)
        ctx.queue_metrics(metrics)
        return torch.where(selected, logps.detach(), logps)

    def rollout_extras(self, batch: RolloutBatch, capture: Capture | None) -> dict:
        # Each completion's row in the generation batch: the global selection's random keys depend on it only.
        start, stop = batch.process_slice.start, batch.process_slice.stop
        return {"exploration_row": torch.arange(start, stop, device=batch.completion_ids.device)}

    def _cov_select_global(self, terms: list[dict], covs: list[torch.Tensor], n: torch.Tensor) -> list[torch.Tensor]:
        """Clip-Cov over the step: `max(1, int(N * clip_cov_ratio))` of the step's candidates, uniformly at random:
        the candidates with the smallest keys (`_clip_cov_keys`), exactly that many as the keys never tie."""
        ctx, args = self.ctx, self.args
        cands, keys = [], []
        for term, cov in zip(terms, covs, strict=True):
            inp, lp, valid = term["inputs"], term["lp"], term["valid"]
            old = inp.get("old_per_token_logps")
            _, log_ratio, a = core_loss._log_ratio_terms(lp, lp if old is None else old, term["a"], valid)
            pg1, pg2 = core_loss._clipped_surrogates(log_ratio, a, ctx.epsilon_low, ctx.epsilon_high)
            cands.append(valid & ~(pg2 > pg1) & (cov > args.clip_cov_lb) & (cov < args.clip_cov_ub))
            keys.append(self._clip_cov_keys(inp["exploration_row"], lp.size(1)))
        local = torch.stack([c.sum() for c in cands]).sum().to(torch.float64).reshape(1)
        n_cand = ctx.sum_over_processes(local)
        n, n_cand = (int(x) for x in torch.cat([n.reshape(1), n_cand]).tolist())  # the one host read
        if n == 0 or n_cand == 0:
            return [torch.zeros_like(c) for c in cands]
        n_sel = min(max(1, int(n * args.clip_cov_ratio)), n_cand)
        # Non-candidates hold the largest key, so they never enter the n_sel smallest of the n_cand >= n_sel keys.
        never = torch.iinfo(torch.int64).max
        values = torch.cat([torch.where(c, k, never).reshape(-1) for k, c in zip(keys, cands, strict=True)])
        threshold = self.global_selection.global_kth(values, n_sel, largest=False)
        return [c & (k <= threshold) for k, c in zip(keys, cands, strict=True)]

    def _clip_cov_keys(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        """`(B, length)` int64 keys from (seed, global step, the completion's row, the position), on the device: the
        same for a token whatever the split over processes and micro-batches, and distinct for distinct tokens."""
        width = self._clip_cov_key_width(length)
        ids = rows.to(torch.int64)[:, None] * width + torch.arange(length, device=rows.device)
        return unique_keys(ids, stream(int(self.args.seed), int(self.ctx.global_step)))

    def _clip_cov_key_width(self, length: int) -> int:
        """Positions per row in the token ids of the keys: `max_completion_length` (the same on every process)."""
        width = max(int(self.args.max_completion_length or length), length)
        rows = self.args.generation_batch_size or 0
        if rows * width >= 1 << ID_BITS:
            raise ValueError(f"cov_selection: global numbers tokens up to 2^{ID_BITS}; generation_batch_size ({rows}) "
                             f"x max_completion_length ({width}) is larger. Use cov_selection: local, or a smaller "
                             "generation batch")
        return width


def _no_selection(ctx) -> str:
    a = ctx.args
    return (f"clip_cov: no token of a micro-batch had a covariance in (clip_cov_lb, clip_cov_ub) = ({a.clip_cov_lb}, "
            f"{a.clip_cov_ub}), so Clip-Cov left that step unchanged (logged as {NO_SELECTION}). If it happens on most "
            "steps, widen the window.")


class ClipCovTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with Clip-Cov's gradient cut (the `ClipCov` strategy)."""

    method = "clip_cov"

"""CaSP (seed "Beyond the Sampled Token"), Eq. 4 (gamma+), Eq. 5 (gamma-), Appendix A/E, Figure 10."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from ...core import losses as core_loss
from ...core.utils import broadcast_advantages
from ...methods import MethodInfo, arxiv_paper, register_method
from ...ops.lm_head import candidate_logps, token_statistics
from ..base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch, check_non_negative
from ...boundary.capture import Capture
from ...boundary.fused_head import CandidateRequest
from ..strategy import LossStrategy


@dataclass
class CaSPConfig(ExplorationGRPOConfig):
    """CaSP: at forking tokens (entropy above the per-response `casp_entropy_quantile`), positive advantages push
    toward the old policy's top-N candidates (weight `casp_alpha`), and a wrong rank-1 sample is penalised by
    `casp_top1_penalty`. Appendix E: N=3, alpha=0.01, lambda=1.1, tau=0.8."""

    casp_alpha: float = field(default=0.01, metadata={"help": "Weight of the top-N smoothed target (Eq. 4)."})
    casp_top_n: int = field(default=3, metadata={"help": "Number of candidate tokens N."})
    casp_top1_penalty: float = field(default=1.1, metadata={"help": "lambda: ratio scale for wrong rank-1 samples (Eq. 5)."})
    casp_entropy_quantile: float = field(
        default=0.8, metadata={"help": "Per-response entropy quantile above which a token forks (tau)."}
    )
    casp_warmup_steps: int = field(
        default=0,
        metadata={"help": "Optimizer steps of plain GRPO before CaSP turns on (Appendix E: 50 on logic tasks, 0 on "
                  "math and code)."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_non_negative(self, {"casp_alpha": "the weight of the top-N target (paper: 0.01; 0 switches CaSP's "
                                                "smoothing off)"})
        if self.casp_top_n < 1:
            raise ValueError(f"casp_top_n must be >= 1, got {self.casp_top_n}")
        if not 0.0 <= self.casp_entropy_quantile <= 1.0:
            raise ValueError(f"casp_entropy_quantile must be in [0, 1], got {self.casp_entropy_quantile}")
        if self.casp_top1_penalty <= 0:
            raise ValueError(f"casp_top1_penalty must be > 0, got {self.casp_top1_penalty}")
        if self.casp_warmup_steps < 0:
            raise ValueError(f"casp_warmup_steps must be >= 0, got {self.casp_warmup_steps}")
        if self.beta != 0.0:
            warnings.warn(
                "CaSP with beta != 0: TRL's reference-KL term is computed from the log-probs CaSP hands the loss "
                "(old + log ratio), so at penalised rank-1 tokens its value is shifted by log(casp_top1_penalty). "
                "The CaSP paper trains with beta = 0.",
                UserWarning, stacklevel=3,
            )


@register_method(MethodInfo(
    name="casp", side="loss", display="CaSP (Candidate-aware Support Preservation)",
    summary="CaSP: positive gradient spread over the top-N candidates at forking tokens",
    description="At high-entropy forking tokens, positive updates are spread over the old policy's top-N candidate "
                "tokens, and a wrong top-1 sample is penalised more strongly.",
    paper=arxiv_paper(
        "peng2025casp", "Beyond the Sampled Token: Preserving Candidate Support in RLVR", "Peng et al., 2025",
        ["Ruotian Peng", "Yi Ren", "Zhouliang Yu", "Weiyang Liu", "Yandong Wen"], 2025, "2510.14807", "cs.AI"),
    config_prefixes=("casp_",), metric_prefixes=("casp/",),
    coefficients={"casp_alpha": 1, "casp_top1_penalty": 0},
    published={"casp_alpha": 0.01, "casp_entropy_quantile": 0.8, "casp_top_n": 3, "casp_top1_penalty": 1.1},
    where="Eq. 4/5, App. A/E",
    changes=("at forking tokens: positive gradient spread over the old policy's top-N candidates; a wrong rank-1 "
             "sample penalised ×λ"),
    knobs_note="(math; logic and code presets in `configs/methods/casp_qwen2.5-7b_{logic,code}.yaml`)",
))
class CaSP(LossStrategy):
    """Loss-side: replaces the sampled-token ratio by `core.casp_ratio` before TRL's clipped objective.

    Candidates (top-N ids, their old log-probs, whether the sample is rank 1) come from the rollout policy's
    pass when TRL runs one (off-policy or vLLM), otherwise from the current detached pass, which then *is*
    the rollout policy. Both ride on TRL's own LM-head pass (`boundary/fused_head.py`, `ops.lm_head.folded_head`):
    at the rollout the top-N of every row are a `topk` of the tiles TRL projects for the old log-probs; in the loss
    the candidates' log-probs with gradient are their logits minus the log-sum-exp the sampled token's log-prob
    needs, from the same tiles, and their gradient comes from the same backward. Where that pass carries no
    candidates (`capture.candidate_logps` is None), they are projected from the captured hidden states as before:
    the top-N at forking tokens (`ops.lm_head.token_statistics`), the log-probs with gradient where they matter,
    forking tokens with A > 0 (`ops.lm_head.candidate_logps`).
    """

    config_class = CaSPConfig

    def __init__(self, ctx):
        super().__init__(ctx)
        ctx.lm_head.fold_candidates(self.candidate_request)

    def needs_rollout_candidates(self) -> bool:
        return self.ctx.trl_computes_old_logps()

    def candidate_request(self, mode: str, inputs) -> CandidateRequest | None:
        """What TRL's captured pass folds in: at the rollout (when TRL's pass is the rollout policy's) the top-N;
        in the loss the log-probs of the rollout's candidates, or the pass's own top-N when fully on-policy; nothing
        during the warm-up."""
        n = self.args.casp_top_n
        if mode == "rollout":
            return CandidateRequest(top_n=n) if self.needs_rollout_candidates() else None
        if self.ctx.global_step < self.args.casp_warmup_steps:
            return None
        if inputs is not None and "casp_topn_ids" in inputs:
            return CandidateRequest(ids=inputs["casp_topn_ids"])
        return CandidateRequest(top_n=n)

    @staticmethod
    def at_forking(forking, ids, logps, completion_ids):
        """The candidates of the forking tokens (ids 0, log-probs 0 and no rank-1 sample elsewhere, as
        `candidates` leaves them) from the top-N `ids` and `logps` `(B, T, N)` of every position."""
        at = forking.unsqueeze(-1)
        return (torch.where(at, ids, 0), torch.where(at, logps.detach(), 0.0),
                forking & (ids[..., 0] == completion_ids))

    def candidates(self, hidden, completion_ids, entropies, mask):
        """Forking mask and, at forking tokens, the top-N candidates of the policy that produced `hidden`, projected
        through the head (where TRL's pass folded none in)."""
        ctx, args = self.ctx, self.args
        forking = core_loss.forking_mask(entropies, mask, args.casp_entropy_quantile)
        b, n_tokens = forking.shape
        n = args.casp_top_n
        at = forking.nonzero(as_tuple=True)  # the one host read (the number of forking tokens)
        ids = torch.zeros(b, n_tokens, n, dtype=torch.long, device=forking.device)
        old = torch.zeros(b, n_tokens, n, device=forking.device)
        is_top1 = torch.zeros(b, n_tokens, dtype=torch.bool, device=forking.device)
        with ctx.lm_head.weights() as (weight, bias, _):  # entered on every process, even with no forking token
            s = token_statistics(
                hidden[at].detach(), weight, bias, completion_ids[at], temperature=ctx.temperature, top_n=n,
                entropy=False,
            )
        ids[at], old[at], is_top1[at] = s["topn_ids"], s["topn_logps"], s["is_top1"]
        return forking, ids, old, is_top1

    def rollout_extras(self, batch: RolloutBatch, capture: Capture | None) -> dict:
        if capture is None or not self.ctx.trl_computes_old_logps():
            return {}
        if capture.candidate_ids is not None:  # folded into TRL's old-log-prob pass
            forking = core_loss.forking_mask(capture.entropies, batch.completion_mask, self.args.casp_entropy_quantile)
            ids, old, is_top1 = self.at_forking(forking, capture.candidate_ids, capture.candidate_logps,
                                                batch.completion_ids)
        else:
            forking, ids, old, is_top1 = self.candidates(
                capture.completion_hidden(), batch.completion_ids, capture.entropies, batch.completion_mask
            )
        return dict(casp_forking=forking, casp_topn_ids=ids, casp_topn_old_logps=old, casp_is_top1=is_top1)

    def transform_logps(self, logps, capture: Capture, inputs, state):
        ctx, args = self.ctx, self.args
        active = ctx.global_step >= args.casp_warmup_steps
        metrics = {"casp/active": (float(active), 1.0)}  # a Python bool: no host read
        if not active:  # warm-up: plain GRPO (the hook ran and chose not to act; logged as casp/active = 0)
            ctx.queue_metrics(metrics)
            return logps
        mask = ctx.loss_mask(inputs)
        old = ctx.old_logps(inputs, logps)
        folded = capture.candidate_logps  # the candidates' log-probs from TRL's pass, (B, T, N), or None
        if "casp_forking" in inputs:
            forking, ids = inputs["casp_forking"], inputs["casp_topn_ids"]
            old_topn, is_top1 = inputs["casp_topn_old_logps"], inputs["casp_is_top1"]
        elif folded is not None:  # fully on-policy: the current detached pass is the rollout policy
            forking = core_loss.forking_mask(capture.entropies, mask, args.casp_entropy_quantile)
            ids, old_topn, is_top1 = self.at_forking(forking, capture.candidate_ids, folded, inputs["completion_ids"])
        else:
            forking, ids, old_topn, is_top1 = self.candidates(capture.completion_hidden(), inputs["completion_ids"],
                                                              capture.entropies, mask)
        advantages = broadcast_advantages(inputs["advantages"], logps.shape)

        # Candidate log-probs with gradient only where the smoothed target acts: forking tokens with A > 0.
        need = forking & (advantages > 0) & mask.bool()
        if folded is not None:
            # From TRL's own pass, at every position: the rest get no gradient (and their ratio's log stays 0).
            topn_log_ratio = torch.where(need.unsqueeze(-1), folded - old_topn, 0.0)
        else:
            # Projected here. Computed on every process even with no such token: under ZeRO-3 the head is gathered
            # in the forward and again in the backward, and every process must take part in both.
            # One host read: the positions of those tokens (`nonzero`), then integer indexing only.
            need = need.nonzero(as_tuple=True)
            with ctx.lm_head.weights() as (weight, bias, regather):
                cur = candidate_logps(capture.completion_hidden()[need], weight, bias, ids[need],
                                      temperature=ctx.temperature, regather=regather)
            topn_log_ratio = torch.zeros_like(old_topn).index_put(need, cur - old_topn[need])
        ratio = core_loss.casp_ratio(
            logps - old, topn_log_ratio, advantages, forking, is_top1,
            alpha=args.casp_alpha, top1_penalty=args.casp_top1_penalty,
        )
        valid = mask.bool()
        penalised = forking & is_top1 & (advantages < 0) & valid
        metrics.update({  # device scalars, read at the next log
            "casp/forking_frac": ((forking & valid).sum(dtype=torch.float32), valid.sum(dtype=torch.float32)),
            "casp/top1_penalty_frac": (penalised.sum(dtype=torch.float32), valid.sum(dtype=torch.float32)),
        })
        ctx.queue_metrics(metrics)
        # TRL forms exp(returned - old): returning old + log(ratio) hands it exactly `ratio`.
        return old + torch.log(ratio)


class CaSPTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with CaSP's candidate-aware ratio (the `CaSP` strategy)."""

    method = "casp"

"""CaSP's candidates folded into TRL's own fused LM-head pass (issue 66).

TRL 1.16 scores the sampled tokens of a forward through `add_fused_lm_head`, whose forward projects the hidden
states through the head with `ChunkedLogProbFunction` (named `_ChunkedLogProbFunction` in `trl.trainer.utils`), tile
by tile of `TOKEN_CHUNK_SIZE` rows x `chunk_size` vocabulary columns. Each tile holds the logits CaSP's candidates
need: at the rollout their top-N (a `topk` of the tile), in the loss their log-probs (a logit minus the log-sum-exp
the sampled token's log-prob needs anyway). While one captured policy call of TRL's runs (`folding`), that name is
bound to a kernel which runs the same pass through `ops.lm_head.folded_head`, with TRL's own per-tile fold and
gradient (`TRLTiles`): the same tiles, the same products and the same statistics, so the log-probs and entropies TRL's
loss and CaSP's forking tokens read are TRL's to the bit; the candidates come from the same tiles, and their gradient
from the same recomputation in the backward. Nothing else changes: the name is restored when the call returns.

Where the pass cannot carry them, the capture records no candidates and CaSP projects its rows through the head
itself, as before (`ops.lm_head.token_statistics` and `candidate_logps`): a fused head asked for outputs other than
the log-probs and the entropy, or a call whose rows do not line up with the positions TRL 1.16 scores.
`tests/test_casp_fold.py` pins what this relies on.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import trl.trainer.utils as trl_utils
from trl.kernels import chunked_logprob as trl_kernel

from ..ops.lm_head import folded_head

__all__ = ["CandidateRequest", "FoldedCandidates", "TRLTiles", "folding", "scored_positions"]

#: The outputs the folded kernel computes (those TRL's GRPO asks of the policy's head).
FOLDED_OUTPUTS = {"log_probs", "entropy"}


@dataclass
class CandidateRequest:
    """What a captured pass should fold in: its own top-`top_n` ids with their log-probs, or the log-probs of given
    ids `(B, T, K)` at the completion positions."""

    top_n: int = 0
    ids: torch.Tensor | None = None


class TRLTiles:
    """`ops.lm_head.TileKernel` of TRL 1.16's `ChunkedLogProbFunction`: its tile shape, its per-tile fold of the
    online log-sum-exp statistics (`_forward_kernel` with Triton, `_forward_tile` without), its per-tile gradient
    (`_backward_kernel` / `_backward_tile`), its float32 accumulation (`_addmm_fp32`) and its gather of a ZeRO-3 head
    for the backward (`maybe_gather_lm_head_ctx`)."""

    token_tile = trl_kernel.TOKEN_CHUNK_SIZE

    def __init__(self, temperature: float, chunk_size: int, softcap: float | None, logit_scale: float,
                 outputs: tuple[str, ...]):
        self.vocab_chunk = chunk_size
        self.raw_gradient = softcap is not None
        self.entropy = "entropy" in outputs
        self.kernel_args = {"logit_scale": logit_scale, "softcap": softcap or 1.0, "inv_t": 1 / temperature,
                            "HAS_SOFTCAP": softcap is not None}
        self.flags = {f"HAS_{name.upper()}": name in outputs for name in trl_kernel.OPTIONAL_OUTPUTS}

    def compute_dtype(self, hidden: torch.Tensor) -> torch.dtype:
        kind = hidden.device.type
        return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype

    def begin(self, targets: torch.Tensor) -> SimpleNamespace:
        n, device = targets.shape[0], targets.device

        def full(value: float) -> torch.Tensor:
            return torch.full((n,), value, device=device, dtype=torch.float32)

        return SimpleNamespace(targets=targets, running_max=full(-math.inf), sum_exp=full(0.0), x_sum_exp=full(0.0),
                               sq_sum_exp=full(0.0), z_sum=full(0.0), max_before_target=full(-math.inf),
                               target_logit=full(0.0))

    def fold(self, state: SimpleNamespace, tile: torch.Tensor, rows: slice, vocab_start: int) -> None:
        fold = trl_kernel._forward_kernel[(tile.shape[0],)] if trl_kernel._use_triton(tile.device) \
            else trl_kernel._forward_tile
        fold(tile, tile.stride(0), state.targets[rows], state.running_max[rows], state.sum_exp[rows],
             state.x_sum_exp[rows], state.sq_sum_exp[rows], state.z_sum[rows], state.max_before_target[rows],
             state.target_logit[rows], vocab_start, tile.shape[1], BLOCK_SIZE=trl_kernel._BLOCK_SIZE, **self.flags,
             **self.kernel_args)

    def finish(self, state: SimpleNamespace):
        log_z = state.running_max + torch.log(state.sum_exp)
        logps = state.target_logit - log_z
        entropy = log_z - state.x_sum_exp / state.sum_exp if self.entropy else None
        return (logps, entropy, None, None, None), log_z, (log_z if entropy is None else entropy)

    def to_grad(self, tile, rows, targets, log_z, saved, grad_logps, grad_entropy, vocab_start) -> None:
        n, n_cols = tile.shape
        if trl_kernel._use_triton(tile.device):
            fold = trl_kernel._backward_kernel[(n, -(-n_cols // trl_kernel._BLOCK_SIZE))]
        else:
            fold = trl_kernel._backward_tile
        fold(tile, tile.stride(0), targets[rows], log_z[rows], saved[rows],
             log_z[rows] if grad_logps is None else grad_logps[rows],
             log_z[rows] if grad_entropy is None else grad_entropy[rows], vocab_start, n_cols,
             HAS_LOGPROB_GRAD=grad_logps is not None, HAS_ENTROPY_GRAD=grad_entropy is not None,
             BLOCK_SIZE=trl_kernel._BLOCK_SIZE, **self.kernel_args)

    def logits(self, raw: torch.Tensor) -> torch.Tensor:
        a = self.kernel_args
        return trl_kernel._torch_transform(raw, a["logit_scale"], a["softcap"], a["inv_t"], a["HAS_SOFTCAP"])

    def logits_grad(self, raw: torch.Tensor) -> torch.Tensor | float:
        a = self.kernel_args
        scale = a["logit_scale"] * a["inv_t"]
        if not a["HAS_SOFTCAP"]:
            return scale
        t = torch.tanh(raw * a["logit_scale"] / a["softcap"])
        return scale * (1 - t * t)

    addmm = staticmethod(trl_kernel._addmm_fp32)

    def gathered(self, weight, bias):
        return trl_utils.maybe_gather_lm_head_ctx(weight, bias)


def scored_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
    """`(B, L - 1)`: where TRL 1.16's fused head scores a label, hidden state t scoring token t + 1. TRL's labels are
    the tokens with `attention_mask` 1 among the last `logits_to_keep` (`_get_per_token_logps_and_entropies`)."""
    labelled = attention_mask != 0
    labelled[:, :-logits_to_keep] = False
    return labelled[:, 1:]


class FoldedCandidates:
    """The candidates one captured `_get_per_token_logps_and_entropies` call folded into TRL's fused head, call of the
    fused forward by call (TRL splits the batch into `batch_size` rows), at the completion positions."""

    def __init__(self, request: CandidateRequest, scored: torch.Tensor, logits_to_keep: int, chunks: list):
        self.request, self.scored, self.logits_to_keep, self.chunks = request, scored, logits_to_keep, chunks
        self.rows = 0  # batch rows scored so far
        self.complete = True  # every call folded
        self.logps: list[torch.Tensor] = []
        self.ids: list[torch.Tensor] = []

    def result(self) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """`(top-N ids or None when given, candidate log-probs)`, each `(B, T, K)`; None unless every call folded."""
        if not self.complete or not self.logps or self.rows != self.scored.shape[0]:
            return None
        logps = torch.cat(self.logps) if len(self.logps) > 1 else self.logps[0]
        ids = (torch.cat(self.ids) if len(self.ids) > 1 else self.ids[0]) if self.ids else None
        return ids, logps

    def kernel(self, original):
        """A stand-in for TRL's `ChunkedLogProbFunction` (its `apply`) that folds the candidates in."""
        return SimpleNamespace(apply=lambda *args: self._apply(original, *args))

    def _apply(self, original, hidden, weight, bias, targets, temperature, chunk_size, softcap, logit_scale, outputs):
        # The backbone hook has just recorded this call's hidden states: its batch rows are the next `b`.
        b = self.chunks[-1].shape[0] if len(self.chunks) == len(self.logps) + 1 else None
        scored = self.scored[self.rows : self.rows + b] if b is not None else None
        # TRL compacts the scored positions on Triton devices; elsewhere it scores every position.
        compact = trl_utils._use_triton(hidden.device)
        fits = scored is not None and scored.shape[0] == b and (compact or hidden.shape[0] == scored.numel())
        if not (self.complete and fits and set(outputs) <= FOLDED_OUTPUTS):
            self.complete = False
            return original.apply(hidden, weight, bias, targets, temperature, chunk_size, softcap, logit_scale, outputs)
        # Row r of the kernel is flat position index[r] of `scored` (the r-th scored one when compacted).
        index = _nth_true(scored.reshape(-1), hidden.shape[0]) if compact else None
        ids = None
        if self.request.ids is not None:
            given = self.request.ids[self.rows : self.rows + b]
            at = given.new_zeros((*scored.shape, given.shape[-1]))
            at[:, -self.logits_to_keep :] = given
            ids = at.reshape(-1, given.shape[-1])
            ids = ids if index is None else ids[index]
        kernel = TRLTiles(temperature, chunk_size, softcap, logit_scale, outputs)
        *per_token, logps, top_ids = folded_head(hidden, weight, bias, targets, kernel, candidate_ids=ids,
                                                 top_n=self.request.top_n if ids is None else 0)
        self.logps.append(self._at_completions(logps, scored, index))
        if top_ids is not None:
            self.ids.append(self._at_completions(top_ids, scored, index))
        self.rows += b
        return tuple(per_token)

    def _at_completions(self, x: torch.Tensor, scored: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
        """Kernel rows `(M, K)` as `(b, T, K)` at the completion positions (zeros where TRL scored nothing)."""
        if index is not None:
            x = x.new_zeros((scored.numel(), x.shape[-1])).index_put((index,), x)
        return x.view(*scored.shape, x.shape[-1])[:, -self.logits_to_keep :]


def _nth_true(flat: torch.Tensor, count: int) -> torch.Tensor:
    """The positions of the first `count` True values of `flat`, in order, without reading the mask on the host."""
    return torch.searchsorted(flat.cumsum(0), torch.arange(1, count + 1, device=flat.device))


@contextmanager
def folding(request: CandidateRequest | None, input_ids, attention_mask, logits_to_keep: int, chunks: list):
    """While TRL's fused head runs inside, fold `request`'s candidates into its pass (yields a `FoldedCandidates`, or
    None with no request). `chunks` is `LMHead.capturing`'s list of hidden states, filled call by call."""
    if request is None:
        yield None
        return
    folded = FoldedCandidates(request, scored_positions(input_ids, attention_mask, logits_to_keep), logits_to_keep,
                              chunks)
    original = trl_utils._ChunkedLogProbFunction
    trl_utils._ChunkedLogProbFunction = folded.kernel(original)
    try:
        yield folded
    finally:
        trl_utils._ChunkedLogProbFunction = original

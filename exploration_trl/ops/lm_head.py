"""Chunked LM-head computations on captured hidden states, never materialising `(B, T, vocab)` logits.

TRL 1.16 scores the sampled token through a fused, chunked LM head. Some methods need more than that
token: CaSP needs the log-probs of the top-N candidates (with gradient), the exploration metrics need
rank-n log-probs and the top-p support. These functions project only the rows they are given, in
row chunks of `chunk_rows x vocab`, and recompute logits in the backward pass instead of saving them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch

#: At most this many rows are projected at once...
DEFAULT_CHUNK_ROWS = 64
#: ...and at most this many logits (8 MB in float32 per buffer), so the extra memory does not grow with the
#: vocabulary: 64 rows at 32k, 13 rows at Qwen2.5's 152k (TRL 1.16 itself tiles 4096 x 32768).
CHUNK_ELEMENTS = 2**21


#: The no-grad metrics on logging steps (`token_statistics` with `top_p`) take rows of up to this many logits: few
#: chunks mean few host reads (the top-p count reads one number per chunk), while each float64 vocabulary buffer stays
#: at 32 MB (all of 64 sampled tokens in one chunk up to a 64k vocabulary, 3 chunks at Qwen2.5's 152k).
METRIC_CHUNK_ELEMENTS = 2**22


def default_chunk_rows(vocab_size: int) -> int:
    """Rows per chunk for a `vocab_size` head: `DEFAULT_CHUNK_ROWS`, fewer for large vocabularies."""
    return max(1, min(DEFAULT_CHUNK_ROWS, CHUNK_ELEMENTS // max(1, int(vocab_size))))


def metric_chunk_rows(vocab_size: int) -> int:
    """Rows per chunk of the logging-step metrics for a `vocab_size` head (`METRIC_CHUNK_ELEMENTS`)."""
    return max(1, METRIC_CHUNK_ELEMENTS // max(1, int(vocab_size)))


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    logits = hidden.to(weight.dtype) @ weight.t()
    if bias is not None:
        logits = logits + bias
    return logits.float() / temperature


def _weight_grad(hidden, weight, bias, ids, lse, grad_out, temperature, chunk_rows) -> torch.Tensor:
    """The float32 `(V, H)` gradient of `candidate_logps` to `weight`: logits recomputed chunk by chunk, the first
    chunk's product becoming the buffer and later chunks accumulating into it (`addmm_`)."""
    grad_weight = None
    for s in range(0, hidden.shape[0], chunk_rows):
        h = hidden[s : s + chunk_rows]
        grad_logits = _grad_logits(h, weight, bias, ids[s : s + chunk_rows], lse[s : s + chunk_rows],
                                   grad_out[s : s + chunk_rows], temperature)
        grad_weight = _add_weight_grad(grad_weight, grad_logits, h)
    return grad_weight if grad_weight is not None else torch.zeros_like(weight, dtype=torch.float32)


def _grad_logits(h, weight, bias, ids, lse, grad_out, temperature) -> torch.Tensor:
    """One chunk's float32 gradient to the logits: d logp_k / d z = e_k - p, summed over the K requested ids, then
    through z = (h W^T + b) / T."""
    g = grad_out.float()
    probs = torch.exp(_logits(h, weight, bias, temperature) - lse[:, None])
    grad_logits = probs.mul_(-g.sum(-1, keepdim=True)).scatter_add_(-1, ids, g)
    grad_logits /= temperature
    return grad_logits


def _add_weight_grad(grad_weight, grad_logits, h) -> torch.Tensor:
    """The first chunk's `(V, H)` product becomes the buffer; later chunks accumulate into it in place."""
    if grad_weight is None:
        return grad_logits.t() @ h.float()
    return grad_weight.addmm_(grad_logits.t(), h.float())


def can_defer_weight_grad(weight: torch.Tensor) -> bool:
    """Whether `candidate_logps` may hand its weight gradient over late (`defer_weight_grad`): a plain leaf tensor
    that requires grad (not a DTensor's gathered copy, not a DeepSpeed-partitioned parameter)."""
    return (weight.is_leaf and weight.requires_grad and type(weight) in (torch.Tensor, torch.nn.Parameter)
            and not hasattr(weight, "ds_id"))


def _defer(ctx, weight, grad_out) -> None:
    """Add this call's weight gradient to the one the engine accumulates into `weight`, once the others have arrived.

    A (V, H) float32 buffer returned from the backward waits in the engine until every other gradient of `weight`
    has arrived, i.e. through all of TRL's own LM-head backward, which is where a step's memory peaks: with Qwen2.5's
    vocabulary that buffer was CaSP's whole excess peak over TRL (39 MB on the toy, 0.5 GB for Qwen2.5-0.5B). A hook
    on `weight` computes it when the summed gradient is ready instead and returns `summed + ours`; with one other
    gradient (an untied head: TRL's) that is the same sum the engine formed (`ours + TRL's`, and addition
    commutes), so the numbers do not change. The price: the logits of these rows are recomputed once more. Should
    no other gradient reach `weight` in this backward, the engine's final callback accumulates ours itself."""
    hidden, _, bias, ids, lse = ctx.saved_tensors
    args = (hidden.detach(), weight, None if bias is None else bias.detach(), ids, lse, grad_out.detach(),
            ctx.temperature, ctx.chunk_rows)
    state = {"added": False, "called": False}

    def ours() -> torch.Tensor:  # a plain local weight (`can_defer_weight_grad`): nothing to gather
        with torch.no_grad():
            return _weight_grad(*args).to(weight.dtype)

    def hook(grad):
        if state["called"]:  # a later backward through the same parameter: not ours
            return None
        state["called"] = True
        if grad is None:  # nothing else reached `weight`: the final callback adds ours
            return None
        state["added"] = True
        return grad + ours()

    handle = weight.register_hook(hook)

    def finish():
        handle.remove()
        if not state["added"]:
            with torch.no_grad():
                extra = ours()
                if weight.grad is None:
                    weight.grad = extra
                else:
                    weight.grad += extra

    torch.autograd.Variable._execution_engine.queue_callback(finish)


class _CandidateLogProbs(torch.autograd.Function):
    """log p(ids[m, k] | hidden[m]) with gradient to `hidden`, `weight` and `bias`; logits are recomputed in backward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, ids, temperature, chunk_rows, regather, defer=False):
        out = hidden.new_empty(ids.shape, dtype=torch.float32)
        lse = hidden.new_empty(ids.shape[0], dtype=torch.float32)
        for s in range(0, hidden.shape[0], chunk_rows):
            logits = _logits(hidden[s : s + chunk_rows], weight, bias, temperature)
            lse[s : s + chunk_rows] = torch.logsumexp(logits, dim=-1)
            out[s : s + chunk_rows] = logits.gather(-1, ids[s : s + chunk_rows]) - lse[s : s + chunk_rows, None]
        ctx.save_for_backward(hidden, weight, bias, ids, lse)
        ctx.temperature, ctx.chunk_rows, ctx.regather = temperature, chunk_rows, regather
        ctx.defer_weight = weight if defer else None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        with ctx.regather():
            return _CandidateLogProbs._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        hidden, weight, bias, ids, lse = ctx.saved_tensors
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        # The (V, H) float32 weight gradient is the one buffer of vocabulary x hidden size this adds: the first chunk's
        # product becomes it and later chunks accumulate into it in place (`addmm_`), rather than a zero-filled buffer
        # plus a second (V, H) product per chunk (which doubled the extra memory at a large vocabulary).
        deferred = ctx.defer_weight is not None and ctx.needs_input_grad[1]
        want_weight = ctx.needs_input_grad[1] and not deferred
        grad_weight = None
        grad_bias = (
            torch.zeros_like(bias, dtype=torch.float32) if bias is not None and ctx.needs_input_grad[2] else None
        )
        for s in range(0, hidden.shape[0], ctx.chunk_rows):
            h = hidden[s : s + ctx.chunk_rows]
            grad_logits = _grad_logits(h, weight, bias, ids[s : s + ctx.chunk_rows], lse[s : s + ctx.chunk_rows],
                                       grad_out[s : s + ctx.chunk_rows], ctx.temperature)
            if grad_hidden is not None:
                grad_hidden[s : s + ctx.chunk_rows] = (grad_logits.to(weight.dtype) @ weight).to(hidden.dtype)
            if want_weight:
                grad_weight = _add_weight_grad(grad_weight, grad_logits, h)
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
        if want_weight:
            if grad_weight is None:  # no rows
                grad_weight = torch.zeros_like(weight)
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        if deferred:
            _defer(ctx, ctx.defer_weight, grad_out)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def candidate_logps(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    regather: Callable[[], AbstractContextManager] | None = None,
    defer_weight_grad: bool | None = None,
) -> torch.Tensor:
    """Log-probs `(M, K)` of token `ids (M, K)` given `hidden (M, H)`, differentiable, O(chunk_rows x vocab) memory.

    `regather` returns a context the backward enters before it reads `weight` again: a sharded weight (DeepSpeed
    ZeRO-3) is only materialised inside such a context. The function runs (forward and backward) even for
    `M = 0`, so that every process of a sharded run enters that context the same number of times.

    `defer_weight_grad` (default: `can_defer_weight_grad(weight)`) computes the `(V, H)` weight gradient when the
    engine has gathered the weight's other gradients, rather than in this function's backward, so that it is not held
    through TRL's own LM-head backward (`_defer`). It costs one more pass of these rows through the head.
    """
    chunk_rows = chunk_rows or default_chunk_rows(weight.shape[0])
    defer = can_defer_weight_grad(weight) if defer_weight_grad is None else bool(defer_weight_grad)
    return _CandidateLogProbs.apply(hidden, weight, bias, ids.long(), temperature, chunk_rows, regather or nullcontext,
                                    defer)


@torch.no_grad()
def token_statistics(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float = 1.0,
    top_n: int = 3,
    top_p: float | None = None,
    chunk_rows: int | None = None,
    entropy: bool = True,
) -> dict[str, torch.Tensor]:
    """No-grad per-row statistics of the next-token distribution at `hidden (M, H)`.

    Returns `target_logps (M,)`, `entropy (M,)` (unless `entropy=False`: callers that already have TRL's
    entropies skip two vocabulary passes), `topn_ids (M, N)`, `topn_logps (M, N)` (rank order), `is_top1 (M,)`
    (the target is the rank-1 candidate) and, when `top_p` is given, `branching (M,)`: the number of candidates
    inside the top-p mass (STILL report Sec. 2.2), exact (`metrics.branching_factor`, float64 masses).
    """
    m = hidden.shape[0]
    dev = hidden.device
    chunk_rows = chunk_rows or default_chunk_rows(weight.shape[0])
    out = {
        "target_logps": torch.zeros(m, device=dev),
        "topn_ids": torch.zeros(m, top_n, dtype=torch.long, device=dev),
        "topn_logps": torch.zeros(m, top_n, device=dev),
        "is_top1": torch.zeros(m, dtype=torch.bool, device=dev),
    }
    if entropy:
        out["entropy"] = torch.zeros(m, device=dev)
    if top_p is not None:
        out["branching"] = torch.zeros(m, dtype=torch.long, device=dev)
    # One ordering per row serves both the top-n candidates and, with top_p, the branching factor's head.
    ordered = top_n
    if top_p is not None:
        from ..metrics.support import HEAD_CANDIDATES, branching_factor

        ordered = max(top_n, min(HEAD_CANDIDATES, weight.shape[0]))
    for s in range(0, m, chunk_rows):
        sl = slice(s, s + chunk_rows)
        logps = torch.log_softmax(_logits(hidden[sl], weight, bias, temperature), dim=-1)
        tgt = targets[sl].long()
        out["target_logps"][sl] = logps.gather(-1, tgt[:, None]).squeeze(-1)
        if entropy:
            out["entropy"][sl] = -(logps.exp() * logps).sum(-1)
        top = logps.topk(ordered, dim=-1)
        out["topn_ids"][sl], out["topn_logps"][sl] = top.indices[:, :top_n], top.values[:, :top_n]
        out["is_top1"][sl] = top.indices[:, 0] == tgt
        if top_p is not None:
            out["branching"][sl] = branching_factor(logps, top_p=top_p, top_values=top.values)
    return out

"""Chunked LM-head computations, never materialising `(B, T, vocab)` logits.

TRL 1.16 scores the sampled token through a fused, chunked LM head. Some methods need more than that
token: CaSP needs the log-probs of the top-N candidates (with gradient), the exploration metrics need
rank-n log-probs and the top-p support.

- `folded_head` is that fused pass itself with CaSP's candidates folded into it: each tile of logits the pass
  computes for the sampled token's log-prob also gives the candidates' (their logit minus the same log-sum-exp)
  and, when asked, the top-N ids (the tile's largest values, `_tile_top`); its backward turns each recomputed tile
  into the gradient of both at once. The per-tile statistics and their gradient are the caller's (`TileKernel`: the boundary hands
  TRL's own, so the sampled token's log-prob and the entropy are TRL's to the bit), so candidates cost no LM-head
  matmul beyond TRL's.
- `candidate_logps` and `token_statistics` project only the rows they are given, in row chunks of
  `chunk_rows x vocab`, recomputing logits in the backward pass instead of saving them: the path where no such pass
  can carry the candidates, and the logging-step metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

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


# ---------------------------------------------------------------------------------------------------------------------
# The fused pass with CaSP's candidates folded in


class TileKernel(Protocol):
    """What one chunked LM-head pass computes of each tile of raw logits (`hidden @ weight.T + bias` in
    `compute_dtype`, rows x vocabulary columns), and its gradient. `folded_head` owns the tiles (their shapes, the
    products, the gradient accumulation) and the candidates; the kernel owns the per-row statistics. The boundary hands
    TRL's own (`boundary/fused_head.py`), so what TRL computes keeps TRL's numbers."""

    token_tile: int  #: rows per tile
    vocab_chunk: int  #: vocabulary columns per tile
    raw_gradient: bool  #: whether `logits_grad` depends on the raw value (a soft cap): the sampled token's is kept

    def compute_dtype(self, hidden: torch.Tensor) -> torch.dtype:
        """The dtype of the products (autocast's when it is on)."""

    def begin(self, targets: torch.Tensor) -> Any:
        """The running statistics of `len(targets)` rows, nothing folded yet."""

    def fold(self, state: Any, tile: torch.Tensor, rows: slice, vocab_start: int) -> None:
        """Fold `tile` (rows `rows`, columns from `vocab_start`) into `state`; `tile` is left as it is."""

    def finish(self, state: Any) -> tuple[tuple, torch.Tensor, torch.Tensor]:
        """`(the pass's outputs, log-sum-exp (M,), what the gradient reads besides it (M,))`; the outputs start with
        the sampled token's log-prob and the entropy (None when not asked for)."""

    def to_grad(self, tile: torch.Tensor, rows: slice, targets: torch.Tensor, log_z: torch.Tensor, saved: torch.Tensor,
                grad_logps: torch.Tensor | None, grad_entropy: torch.Tensor | None, vocab_start: int) -> None:
        """Turn `tile` (its raw logits, recomputed) in place into the gradient to them of the loss, given the upstream
        gradients of the sampled token's log-prob and of the entropy (each None when it has none)."""

    def logits(self, raw: torch.Tensor) -> torch.Tensor:
        """The float32 logits (scaled, capped, divided by the temperature) of raw float32 values."""

    def logits_grad(self, raw: torch.Tensor) -> torch.Tensor | float:
        """d logits / d raw at raw float32 values (a number when it does not depend on them)."""

    def addmm(self, acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        """`acc += a @ b`, `acc` float32, without rounding the product to the inputs' dtype first."""

    def gathered(self, weight: torch.Tensor, bias: torch.Tensor | None) -> AbstractContextManager:
        """The head's full parameters for the backward's recomputation (a sharded head: ZeRO-3)."""


def _tiles(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
           kernel: TileKernel) -> Iterator[tuple[slice, int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each tile of raw logits in turn, as `(rows, vocab_start, tile, hidden rows, weight rows)` (the last two in
    `dtype`). Every tile is a view of one buffer of `token_tile x vocab_chunk`: valid until the next is made."""
    m, vocab = hidden.shape[0], weight.shape[0]
    buffer = torch.empty((min(m, kernel.token_tile), kernel.vocab_chunk), device=hidden.device, dtype=dtype)
    for first in range(0, m, kernel.token_tile):
        rows = slice(first, min(first + kernel.token_tile, m))
        h = hidden[rows].to(dtype)
        for start in range(0, vocab, kernel.vocab_chunk):
            end = min(start + kernel.vocab_chunk, vocab)
            w = weight[start:end].to(dtype)
            tile = buffer[: rows.stop - first, : end - start]
            torch.mm(h, w.t(), out=tile)
            if bias is not None:
                tile.add_(bias[start:end].to(dtype))
            yield rows, start, tile, h, w


def _gather_tile(out: torch.Tensor, tile: torch.Tensor, ids: torch.Tensor, vocab_start: int) -> None:
    """`out[i, j] = tile[i, ids[i, j] - vocab_start]` (as float32) where that id is one of the tile's columns."""
    local = ids - vocab_start
    inside = (local >= 0) & (local < tile.shape[1])
    values = tile.gather(1, local.clamp(0, tile.shape[1] - 1)).float()
    out.copy_(torch.where(inside, values, out))


#: Columns per block of `_tile_top`: its pass over a tile reads each block's maximum (256: fastest on CPU, 2026-12-06).
TOP_BLOCK = 256


def _tile_top(tile: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's `k` largest values of `tile` and their columns, in descending order (the values of a `topk`).

    The k largest values lie in the k blocks of `TOP_BLOCK` columns with the largest maxima (a block holding one of
    them has a maximum at least as large, and so does each block ranked above it), so one pass takes the blocks'
    maxima, and a `topk` runs over those k blocks only: on CPU about a quarter of the time of a `topk` of the tile
    (8 against 35 ms for 576 x 32,768 float32, 1 thread). A tile whose width is not a multiple of the block (the
    vocabulary's last chunk) or too narrow gets the plain `topk`."""
    rows, n = tile.shape
    blocks = n // TOP_BLOCK
    if n % TOP_BLOCK or blocks < k:
        top = tile.topk(min(k, n), dim=1)
        return top.values, top.indices
    blocked = tile.unflatten(1, (blocks, TOP_BLOCK))
    best_blocks = blocked.amax(-1).topk(k, dim=1).indices  # (rows, k)
    values = blocked.gather(1, best_blocks.unsqueeze(-1).expand(rows, k, TOP_BLOCK)).flatten(1)  # (rows, k * block)
    top = values.topk(k, dim=1)
    columns = best_blocks.gather(1, top.indices // TOP_BLOCK) * TOP_BLOCK + top.indices % TOP_BLOCK
    return top.values, columns


def _merge_top(best: torch.Tensor, best_ids: torch.Tensor, tile: torch.Tensor, vocab_start: int) -> None:
    """Fold one tile's columns into each row's running top-k: `best` its raw values (float32, descending) and
    `best_ids` their vocabulary ids. The logits are an increasing function of the raw values, so their order is the
    logits' order. Of equal values across tiles the lower id (the earlier tile) stays ahead; within a tile, in no set
    order (as a `topk`'s). The tile is only read (`_tile_top`)."""
    k = best.shape[1]
    values, ids = _tile_top(tile, k)
    values, ids = values.float(), ids + vocab_start
    if vocab_start == 0 and values.shape[1] == k:  # the first columns of these rows: nothing to merge with
        best.copy_(values)
        best_ids.copy_(ids)
        return
    # Earlier columns first and a stable sort, so that of equal values the lower id stays ahead.
    values, ids = torch.cat([best, values], dim=1), torch.cat([best_ids, ids], dim=1)
    order = values.sort(dim=1, descending=True, stable=True).indices[:, :k]
    best.copy_(values.gather(1, order))
    best_ids.copy_(ids.gather(1, order))


def _add_candidate_grad(tile: torch.Tensor, rows: slice, vocab_start: int, ids: torch.Tensor, targets: torch.Tensor,
                        grad: torch.Tensor, total: torch.Tensor, raw: torch.Tensor, raw_target: torch.Tensor | None,
                        kernel: TileKernel) -> None:
    """The candidates' share of the gradient to the raw logits of `tile`, added in place to the kernel's.

    d logp_c / dz = e_c - p for every candidate c. The kernel was handed the sampled token's upstream gradient plus
    the candidates' (`total`), which puts every candidate's `-p` in (as `-(g_t + total) p`) and also `total` at the
    sampled token's one-hot. What is left is sparse: `+g_c` at each candidate's id and `-total` at the sampled token,
    each times d logits / d raw there."""
    n_cols = tile.shape[1]
    scale = kernel.logits_grad(raw[rows])  # a number unless the kernel's logits are capped (`raw_gradient`)
    scale_target = kernel.logits_grad(raw_target[rows]) if raw_target is not None else scale
    index = torch.cat([ids[rows], targets[rows, None]], dim=1) - vocab_start
    values = torch.cat([grad[rows] * scale, -total[rows, None] * scale_target], dim=1)
    inside = (index >= 0) & (index < n_cols)
    tile.scatter_add_(1, index.clamp(0, n_cols - 1), torch.where(inside, values, 0.0).to(tile.dtype))


class _FoldedHead(torch.autograd.Function):
    """The chunked pass of `kernel` over `hidden`, plus candidate log-probs from the same tiles (`folded_head`)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, ids, top_n, kernel):
        ctx.set_materialize_grads(False)  # the entropy often has no gradient: no zeros to fold in
        m = hidden.shape[0]
        dtype = kernel.compute_dtype(hidden)
        state = kernel.begin(targets)
        given = ids is not None
        k = ids.shape[1] if given else top_n
        raw = torch.full((m, k), 0.0 if given else -math.inf, device=hidden.device, dtype=torch.float32)
        best = None if given else torch.zeros((m, k), dtype=torch.long, device=hidden.device)
        raw_target = torch.zeros((m, 1), device=hidden.device, dtype=torch.float32) if kernel.raw_gradient else None
        for rows, start, tile, _, _ in _tiles(hidden, weight, bias, dtype, kernel):
            kernel.fold(state, tile, rows, start)
            if raw_target is not None:
                _gather_tile(raw_target[rows], tile, targets[rows, None], start)
            if given:
                _gather_tile(raw[rows], tile, ids[rows], start)
            else:
                _merge_top(raw[rows], best[rows], tile, start)
        outputs, log_z, saved = kernel.finish(state)
        logps = kernel.logits(raw) - log_z[:, None]
        ctx.save_for_backward(hidden, weight, bias, targets, log_z, saved, ids if given else best, raw, raw_target)
        ctx.kernel, ctx.dtype = kernel, dtype
        ctx.mark_non_differentiable(*(x for x in (*outputs[2:], best) if x is not None))
        return (*outputs, logps, best)

    @staticmethod
    def backward(ctx, grad_logps, grad_entropy, *grads):
        hidden, weight, bias, targets, log_z, saved, ids, raw, raw_target = ctx.saved_tensors
        kernel = ctx.kernel
        grad_cand = grads[-2]
        total = None
        if grad_cand is not None:
            grad_cand = grad_cand.float()
            total = grad_cand.sum(-1)
            grad_logps = total if grad_logps is None else grad_logps.float() + total
        if grad_logps is None and grad_entropy is None:
            return (None,) * 7
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        with kernel.gathered(weight, bias):
            # Accumulated in float32 whatever the inputs' dtype.
            grad_hidden = torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32) if need_hidden else None
            grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if need_weight else None
            grad_bias = (torch.zeros(bias.shape, device=bias.device, dtype=torch.float32)
                         if bias is not None and need_bias else None)
            grad_logps = grad_logps.float().contiguous() if grad_logps is not None else None
            grad_entropy = grad_entropy.float().contiguous() if grad_entropy is not None else None
            for rows, start, tile, h, w in _tiles(hidden, weight, bias, ctx.dtype, kernel):
                kernel.to_grad(tile, rows, targets, log_z, saved, grad_logps, grad_entropy, start)
                if grad_cand is not None:
                    _add_candidate_grad(tile, rows, start, ids, targets, grad_cand, total, raw, raw_target, kernel)
                if grad_hidden is not None:
                    kernel.addmm(grad_hidden[rows], tile, w)
                if grad_weight is not None:
                    kernel.addmm(grad_weight[start : start + tile.shape[1]], tile.t(), h)
                if grad_bias is not None:
                    grad_bias[start : start + tile.shape[1]] += tile.sum(dim=0, dtype=torch.float32)
        return (
            grad_hidden.to(hidden.dtype) if grad_hidden is not None else None,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            None, None, None, None,
        )


def folded_head(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    kernel: TileKernel,
    candidate_ids: torch.Tensor | None = None,
    top_n: int = 0,
) -> tuple:
    """One chunked LM-head pass over `hidden (M, H)`: `kernel`'s outputs for the sampled tokens `targets (M,)` and,
    from the same tiles, candidate log-probs with gradient, O(tile) memory and no LM-head matmul of their own.

    The candidates are either given (`candidate_ids (M, K)`: the rollout policy's top-N, scored by the current one)
    or the pass's own top-`top_n` (its ids are then returned, in rank order). Returns `kernel`'s outputs followed by
    `candidate_logps (M, K)` (log p = logit - the log-sum-exp the sampled token's log-prob needs; differentiable) and
    the top-N ids `(M, K)` (None when given). The backward recomputes each tile once, as the kernel's own does, and
    turns it into the gradient of all of them (`_add_candidate_grad`)."""
    if (candidate_ids is None) == (top_n <= 0):
        raise ValueError("folded_head: give either candidate_ids or top_n > 0")
    ids = None if candidate_ids is None else candidate_ids.long()
    return _FoldedHead.apply(hidden, weight, bias, targets, ids, int(top_n), kernel)

"""Chunked LM-head ops against dense full-vocabulary computations."""

from typing import ClassVar

import torch

from exploration_trl.ops.lm_head import candidate_logps, token_statistics


def dense(hidden, weight, bias, temperature):
    return torch.log_softmax((hidden @ weight.t() + bias) / temperature, -1)


def test_candidate_logps_forward_and_backward_match_dense():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, generator=g, requires_grad=True)
    weight = torch.randn(11, 5, generator=g, requires_grad=True)
    bias = torch.randn(11, generator=g, requires_grad=True)
    ids = torch.randint(0, 11, (7, 3), generator=g)
    upstream = torch.randn(7, 3, generator=g)

    out = candidate_logps(hidden, weight, bias, ids, temperature=0.7, chunk_rows=3)  # 3 chunks, last partial
    (out * upstream).sum().backward()
    ours = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None

    ref = dense(hidden, weight, bias, 0.7).gather(-1, ids)
    (ref * upstream).sum().backward()
    torch.testing.assert_close(out, ref.detach())
    for mine, t in zip(ours, (hidden, weight, bias)):
        torch.testing.assert_close(mine, t.grad, rtol=1e-5, atol=1e-6)


def test_candidate_logps_empty_rows_keep_graph():
    hidden = torch.zeros(0, 4, requires_grad=True)
    out = candidate_logps(hidden, torch.randn(6, 4), None, torch.zeros(0, 2, dtype=torch.long))
    assert out.shape == (0, 2)
    out.sum().backward()  # no error: connected to the graph


class CountingContext:
    """Stands in for ZeRO-3's gather: counts how often the backward re-enters it."""

    def __init__(self):
        self.entered = 0

    def __call__(self):
        return self

    def __enter__(self):
        self.entered += 1

    def __exit__(self, *exc):
        return False


def test_candidate_logps_backward_regathers_even_with_no_rows():
    """Under ZeRO-3 every process must enter the gather in the backward, also one with no candidate rows."""
    for rows in (0, 3):
        regather = CountingContext()
        hidden = torch.randn(rows, 4, requires_grad=True)
        weight = torch.randn(6, 4, requires_grad=True)
        out = candidate_logps(hidden, weight, None, torch.zeros(rows, 2, dtype=torch.long), regather=regather)
        # As CaSP uses it: scattered into a dense tensor through an index that may select nothing.
        dense_out = torch.zeros(5, 2).index_put((torch.arange(5) < rows,), out)
        dense_out.sum().backward()
        assert regather.entered == 1, rows
        assert weight.grad is not None and weight.grad.shape == weight.shape


def test_token_statistics_hand_distribution():
    # One row, identity head: logits = hidden = log([0.5, 0.3, 0.15, 0.05]) -> probs exactly those.
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    hidden = probs.log()
    stats = token_statistics(hidden, torch.eye(4), None, torch.tensor([1]), top_n=2, top_p=0.95)
    torch.testing.assert_close(stats["target_logps"], torch.tensor([0.3]).log())
    torch.testing.assert_close(stats["topn_logps"], torch.tensor([[0.5, 0.3]]).log())
    assert stats["topn_ids"].tolist() == [[0, 1]] and stats["is_top1"].tolist() == [False]
    # 0.5 + 0.3 + 0.15 = 0.95 reaches top_p with 3 candidates.
    assert stats["branching"].tolist() == [3]
    expected_entropy = -(probs * probs.log()).sum()
    torch.testing.assert_close(stats["entropy"], expected_entropy.reshape(1))


def test_chunk_rows_keep_the_logit_buffer_bounded_as_the_vocabulary_grows():
    from exploration_trl.ops.lm_head import CHUNK_ELEMENTS, default_chunk_rows

    assert default_chunk_rows(100) == 64 and default_chunk_rows(32768) == 64  # 8 MB float32 buffers at 32k
    assert default_chunk_rows(151936) == 13  # Qwen2.5: 13 x 151936 <= 2**21 logits
    for vocab in (1000, 32768, 151936, 262144, 10**7):
        rows = default_chunk_rows(vocab)
        assert rows >= 1 and (rows == 1 or rows * vocab <= CHUNK_ELEMENTS)


class _OtherHead(torch.autograd.Function):
    """A second user of the weight (TRL's own head in a trainer) that records, in its backward, how many times the
    candidate weight gradient had been computed by then."""

    seen: ClassVar[list[int]] = []

    @staticmethod
    def forward(ctx, hidden, weight):
        ctx.save_for_backward(hidden, weight)
        return hidden @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        import exploration_trl.ops.lm_head as ops

        hidden, weight = ctx.saved_tensors
        _OtherHead.seen.append(ops._weight_grad.calls)
        return grad @ weight, grad.t() @ hidden


def _run_with_other_head(defer, accumulate=1, other=True, rows=9, vocab=37):
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(vocab, 6, generator=g, requires_grad=True)
    bias = torch.randn(vocab, generator=g, requires_grad=True)
    hidden = torch.randn(rows, 6, generator=g, requires_grad=True)
    ids = torch.randint(0, vocab, (rows, 3), generator=g)
    for _ in range(accumulate):  # gradient accumulation: the second backward adds to `.grad`
        loss = (candidate_logps(hidden, weight, bias, ids, temperature=0.7, chunk_rows=4,
                                defer_weight_grad=defer) * torch.randn(rows, 3, generator=g)).sum()
        if other:
            loss = loss + _OtherHead.apply(torch.randn(5, 6, generator=g), weight).square().sum()
        loss.backward()
    return weight.grad, bias.grad, hidden.grad


def test_candidate_weight_gradient_waits_for_the_other_heads_and_is_bit_identical(monkeypatch):
    """Deferred, the (V, H) weight gradient is computed after the other user of the weight has run its backward (so
    it is not held through TRL's LM-head backward, where a step peaks), and the gradients are bit for bit those of
    the engine's own accumulation: with a second head, with accumulation into `.grad`, and with no other user."""
    import exploration_trl.ops.lm_head as ops

    real = ops._weight_grad

    def counted(*args):
        counted.calls += 1
        return real(*args)

    counted.calls = 0
    monkeypatch.setattr(ops, "_weight_grad", counted)
    for kwargs in ({}, {"accumulate": 2}, {"other": False}, {"rows": 0}):
        _OtherHead.seen.clear()
        counted.calls = 0
        deferred = _run_with_other_head(True, **kwargs)
        if kwargs.get("other", True):
            assert _OtherHead.seen[0] == 0, kwargs  # not computed before the other head's backward
        assert counted.calls == kwargs.get("accumulate", 1), kwargs  # once per backward, in the hook
        direct = _run_with_other_head(False, **kwargs)
        for a, b in zip(deferred, direct, strict=True):
            assert torch.equal(a, b), kwargs
    assert ops.can_defer_weight_grad(torch.nn.Parameter(torch.zeros(2, 2)))
    assert not ops.can_defer_weight_grad(torch.zeros(2, 2))  # needs no gradient
    assert not ops.can_defer_weight_grad(torch.zeros(2, 2, requires_grad=True) * 2)  # not a leaf (FSDP2's copy)

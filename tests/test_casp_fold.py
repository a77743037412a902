"""CaSP's candidates folded into TRL's own LM-head pass (issue 66: `ops.lm_head.folded_head`,
`boundary/fused_head.py`).

- The folded pass is TRL's kernel to the bit: the same log-probs, entropies and gradients (with softcap, logit scale,
  bias, several token tiles and vocabulary chunks), so CaSP's forking tokens are chosen from TRL's entropies.
- Its candidates equal a dense full-vocabulary computation: the top-N ids, their log-probs, given ids' log-probs and
  the gradient of all of them.
- In the trainer, the rollout and loss passes carry the candidates (TRL's compacted rows too, and a pass split into
  `batch_size` calls), with the same candidates, loss and gradient as the projection through the head they replace,
  no matmul and no host read of their own; where the pass cannot carry them, CaSP projects them as before.
- What it relies on in TRL 1.16.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import trl.trainer.utils as trl_utils
from torch.utils.flop_counter import FlopCounterMode
from trl import GRPOTrainer
from trl.kernels import chunked_logprob as trl_kernel

from exploration_trl.boundary.capture import Capture
from exploration_trl.boundary.fused_head import CandidateRequest, FoldedCandidates, TRLTiles, scored_positions
from exploration_trl.ops.lm_head import _tile_top, folded_head
from exploration_trl.ops.sync_count import count_syncs
from helpers import toy_checkpoint
from test_trl_contract import hand_inputs, make_trainer

OUTPUTS = ("log_probs", "entropy")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def _head(seed, rows=13, hidden=6, vocab=23, bias=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=g, requires_grad=True)
    b = torch.randn(vocab, generator=g, requires_grad=True) if bias else None
    return g, h, w, b, torch.randint(0, vocab, (rows,), generator=g)


def _grads(*tensors):
    out = [None if t is None else t.grad.clone() for t in tensors]
    for t in tensors:
        if t is not None:
            t.grad = None
    return out


@pytest.fixture
def small_tiles(monkeypatch):
    """Several token tiles (5 rows) in both kernels, so that tiles and vocabulary chunks both split."""
    monkeypatch.setattr(trl_kernel, "TOKEN_CHUNK_SIZE", 5)
    monkeypatch.setattr(TRLTiles, "token_tile", 5)


@pytest.mark.parametrize("softcap,scale,bias", [(None, 1.0, True), (3.0, 0.8, False), (None, 1.3, True)])
@pytest.mark.parametrize("candidate_grad", [None, "zero"])
def test_folded_pass_is_trls_kernel_to_the_bit(small_tiles, softcap, scale, bias, candidate_grad):
    g, h, w, b, targets = _head(0, bias=bias)
    up_logps, up_entropy = torch.randn(13, generator=g), torch.randn(13, generator=g)
    ref = trl_kernel.ChunkedLogProbFunction.apply(h, w, b, targets, 0.7, 7, softcap, scale, OUTPUTS)
    (ref[0] * up_logps + ref[1] * up_entropy).sum().backward()
    trl_grads = _grads(h, w, b)

    out = folded_head(h, w, b, targets, TRLTiles(0.7, 7, softcap, scale, OUTPUTS), top_n=3)
    loss = (out[0] * up_logps + out[1] * up_entropy).sum()
    if candidate_grad == "zero":  # every candidate in the graph with a zero gradient (CaSP's positions without A > 0)
        loss = loss + (out[5] * 0.0).sum()
    loss.backward()
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert out[2] is out[3] is out[4] is None
    for ours, theirs in zip(_grads(h, w, b), trl_grads):
        assert (ours is None and theirs is None) or torch.equal(ours, theirs)


def _dense(h, w, b, scale, softcap, temperature):
    y = (h @ w.t() + (0 if b is None else b)) * scale
    if softcap is not None:
        y = softcap * torch.tanh(y / softcap)
    return torch.log_softmax(y / temperature, -1)


@pytest.mark.parametrize("softcap,scale,bias", [(None, 1.0, True), (3.0, 0.8, False)])
def test_folded_candidates_match_a_dense_computation(small_tiles, softcap, scale, bias):
    g, h, w, b, targets = _head(1, bias=bias)
    kernel = TRLTiles(0.7, 7, softcap, scale, OUTPUTS)
    up = [torch.randn(13, generator=g), torch.randn(13, generator=g), torch.randn(13, 3, generator=g)]
    for given in (None, torch.randint(0, 23, (13, 3), generator=g)):
        out = folded_head(h, w, b, targets, kernel, candidate_ids=given, top_n=0 if given is not None else 3)
        (out[0] * up[0] + out[1] * up[1] + (out[5] * up[2]).sum(-1)).sum().backward()
        ours = _grads(h, w, b)
        logp = _dense(h, w, b, scale, softcap, 0.7)
        ids = logp.detach().topk(3, -1).indices if given is None else given
        if given is None:
            assert torch.equal(out[6], ids)  # the top-3 in rank order
        else:
            assert out[6] is None
        torch.testing.assert_close(out[5], logp.gather(-1, ids).detach(), rtol=1e-5, atol=1e-5)
        entropy = -(logp.exp() * logp).sum(-1)
        (logp.gather(-1, targets[:, None]).squeeze(-1) * up[0] + entropy * up[1]
         + (logp.gather(-1, ids) * up[2]).sum(-1)).sum().backward()
        for mine, dense in zip(ours, _grads(h, w, b)):
            if dense is not None:
                torch.testing.assert_close(mine, dense, rtol=1e-5, atol=1e-5)


def test_folded_pass_with_no_rows_keeps_the_graph_and_regathers():
    """A process with no row still runs the backward and enters the head's gather once (ZeRO-3 collectives)."""

    class Counting(TRLTiles):
        entered = 0

        def gathered(self, weight, bias):
            type(self).entered += 1
            return super().gathered(weight, bias)

    w = torch.randn(6, 4, requires_grad=True)
    h = torch.zeros(0, 4, requires_grad=True)
    out = folded_head(h, w, None, torch.zeros(0, dtype=torch.long), Counting(1.0, 4, None, 1.0, OUTPUTS), top_n=2)
    assert out[5].shape == (0, 2) and out[6].shape == (0, 2)
    (out[0].sum() + out[5].sum()).backward()
    assert Counting.entered == 1 and w.grad is not None and w.grad.shape == w.shape


# ----------------------------------------------------------------------------------------------- in the trainer
def _spy_capture(trainer):
    """Record the captures the loss hook and the rollout extras see."""
    seen = {}
    transform, extras = trainer._transform_policy_logps, trainer._rollout_extras

    def on_loss(logps, capture, inputs, state):
        seen["loss"] = capture
        return transform(logps, capture, inputs, state)

    def on_rollout(batch, capture):
        seen["rollout"] = capture
        return extras(batch, capture)

    trainer._transform_policy_logps, trainer._rollout_extras = on_loss, on_rollout
    return seen


def _loss_and_grads(trainer, inputs):
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, dict(inputs))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters()}


def _casp(ckpt, tmp_path, **overrides):
    cfg = dict(casp_alpha=0.5, casp_top1_penalty=1.5, casp_entropy_quantile=0.3, exploration_metrics=False)
    return make_trainer(ckpt, tmp_path, method="casp", temperature=0.8, **{**cfg, **overrides})


def _unfolded(trainer):
    """The same trainer with nothing folded: CaSP projects its candidates through the head (the path before 66)."""
    trainer.lm_head.candidate_request = lambda mode, inputs: None


def _assert_same_step(a, b):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    torch.testing.assert_close(loss_a, loss_b, rtol=0, atol=0)  # the ratio's value does not read the candidates
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("compact", [False, True])
def test_the_loss_pass_carries_the_candidates_on_policy(ckpt, tmp_path, monkeypatch, compact):
    """On-policy the loss pass's own top-N are the candidates: same loss and gradient as projecting them. `compact`:
    TRL's Triton layout (only the scored positions reach the kernel), here with its CPU folds."""
    if compact:
        monkeypatch.setattr(trl_utils, "_use_triton", lambda device: True)
    trainer = _casp(ckpt, tmp_path)
    seen = _spy_capture(trainer)
    inputs = hand_inputs(trainer, seed=3)
    folded = _loss_and_grads(trainer, inputs)
    capture = seen["loss"]
    assert capture.candidate_ids.shape == capture.candidate_logps.shape == (4, 5, 3)
    assert capture.candidate_logps.requires_grad
    _unfolded(trainer)
    unfolded = _loss_and_grads(trainer, inputs)
    assert seen["loss"].candidate_logps is None
    _assert_same_step(folded, unfolded)


def test_the_rollout_and_loss_passes_carry_the_candidates_off_policy(ckpt, tmp_path):
    """TRL's old-log-prob pass (split into `batch_size` calls) carries the top-N; the loss pass the log-probs of
    those ids under the current policy. Same candidates, loss and gradient as projecting them."""
    trainer = _casp(ckpt, tmp_path, steps_per_generation=2, per_device_train_batch_size=2)
    seen = _spy_capture(trainer)
    trainer.model.train()
    out = trainer._generate_and_score_completions([trainer.train_dataset[i] for i in range(4)])
    capture = seen["rollout"]
    assert capture.candidate_ids is not None  # folded, over two calls of 2 rows each
    strategy = trainer.strategies[0]
    forking, ids, old, is_top1 = strategy.candidates(capture.completion_hidden(), out["completion_ids"],
                                                     capture.entropies, out["completion_mask"])
    assert torch.equal(out["casp_forking"], forking) and forking.any()
    assert torch.equal(out["casp_topn_ids"], ids) and torch.equal(out["casp_is_top1"], is_top1)
    torch.testing.assert_close(out["casp_topn_old_logps"], old, rtol=1e-6, atol=1e-6)

    with torch.no_grad():  # a policy that has moved since the rollout
        g = torch.Generator().manual_seed(1)
        for p in trainer.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    inputs = {k: v for k, v in out.items()}
    inputs["advantages"] = torch.tensor([1.0, -0.5, 2.0, -1.5])
    folded = _loss_and_grads(trainer, inputs)
    assert seen["loss"].candidate_ids is None and seen["loss"].candidate_logps.shape == ids.shape  # given ids
    _unfolded(trainer)
    _assert_same_step(folded, _loss_and_grads(trainer, inputs))


def test_casp_adds_no_matmul_and_no_host_read_to_the_loss(ckpt, tmp_path):
    """CaSP's loss and backward do GRPO's matmul FLOPs exactly and read nothing more on the host."""
    counts = {}
    for method in ("grpo", "casp"):
        trainer = make_trainer(ckpt, tmp_path / method, method=method, exploration_metrics=False,
                               **({"casp_entropy_quantile": 0.3} if method == "casp" else {}))
        inputs = hand_inputs(trainer, seed=3)
        with FlopCounterMode(display=False) as flops, count_syncs() as syncs:
            trainer.compute_loss(trainer.model, dict(inputs)).backward()
        counts[method] = (flops.get_total_flops(), syncs["syncs"])
    assert counts["casp"] == counts["grpo"], counts


def test_a_pass_that_cannot_carry_them_falls_back():
    """A fused head asked for more than the log-probs and the entropy runs TRL's kernel: nothing is folded, and CaSP
    projects its candidates itself."""
    g, h, w, b, targets = _head(2, rows=2 * 4)
    ids = torch.tensor([[1, 2, 3, 4, 5]] * 2)
    scored = scored_positions(ids, torch.ones_like(ids), 2)
    folded = FoldedCandidates(CandidateRequest(top_n=3), scored, 2, chunks=[torch.zeros(2, 5, 6)])
    kernel = folded.kernel(trl_kernel.ChunkedLogProbFunction)
    outputs = ("log_probs", "entropy", "is_top1")
    out = kernel.apply(h, w, b, targets, 1.0, 7, None, 1.0, outputs)
    ref = trl_kernel.ChunkedLogProbFunction.apply(h, w, b, targets, 1.0, 7, None, 1.0, outputs)
    assert all(x is y is None or torch.equal(x, y) for x, y in zip(out, ref, strict=True))
    assert not folded.complete and folded.result() is None


def test_nothing_is_folded_during_the_warm_up(ckpt, tmp_path):
    trainer = _casp(ckpt, tmp_path, casp_warmup_steps=1)
    seen = _spy_capture(trainer)
    trainer.compute_loss(trainer.model, hand_inputs(trainer))
    assert seen["loss"].candidate_logps is None


def test_trl_contract_of_the_fold():
    """What `boundary/fused_head.py` relies on in TRL 1.16: its fused forward calls the kernel through the module name
    it rebinds, with the layout it maps rows by; the labels it scores; the kernel's per-tile functions."""
    fused = inspect.getsource(trl_utils.add_fused_lm_head)
    assert "per_token = _ChunkedLogProbFunction.apply(" in fused
    assert "compact = _use_triton(hidden_states.device)" in fused
    assert "hidden_states[mask] if compact else hidden_states.reshape(-1, hidden_states.size(-1))" in fused
    assert "hidden_states = backbone_outputs.last_hidden_state[:, :-1]" in fused and "labels = labels[:, 1:]" in fused
    src = inspect.getsource(GRPOTrainer._get_per_token_logps_and_entropies)
    assert "labels = input_ids_batch.masked_fill(attention_mask_batch == 0, -100)" in src
    assert "labels[:, :-logits_to_keep] = -100" in src
    assert "all_logps.append(outputs.log_probs[:, -logits_to_keep:])" in src
    assert trl_utils._ChunkedLogProbFunction is trl_kernel.ChunkedLogProbFunction
    for name in ("_forward_tile", "_backward_tile", "_forward_kernel", "_backward_kernel", "_addmm_fp32",
                 "_torch_transform", "_use_triton", "TOKEN_CHUNK_SIZE", "_BLOCK_SIZE", "OPTIONAL_OUTPUTS"):
        assert hasattr(trl_kernel, name), name


def test_scored_positions_are_trls_labels(ckpt, tmp_path):
    trainer = make_trainer(ckpt, tmp_path)
    inputs = hand_inputs(trainer)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    _, head = trainer.lm_head.of(trainer.model)
    seen = {}
    original = trl_utils.maybe_gather_lm_head_ctx

    def spy(*params):  # called by the fused forward right before its kernel: its labels are in the frame above
        frame = inspect.currentframe().f_back
        seen["mask"] = frame.f_locals.get("mask")
        return original(*params)

    trl_utils.maybe_gather_lm_head_ctx = spy
    try:
        with torch.no_grad():
            trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 5)
    finally:
        trl_utils.maybe_gather_lm_head_ctx = original
    assert torch.equal(seen["mask"], scored_positions(ids, mask, 5))
    assert Capture(mode="rollout").candidate_logps is None



@pytest.mark.parametrize("correction", [True, False])
def test_under_vllm_trls_passes_carry_the_candidates(ckpt, tmp_path, monkeypatch, correction):
    """vLLM hands the trainer no logits: with TRL's importance-sampling correction (its default) TRL's old-log-prob
    pass runs and carries the top-N; without it, on-policy, the loss pass does. Either way CaSP projects nothing."""
    import exploration_trl.trainers.methods.casp as casp_module
    from test_vllm_inputs import make_trainer as vllm_trainer, rollout, wild_sampling_logps

    projected = []
    for name in ("token_statistics", "candidate_logps"):
        real = getattr(casp_module, name)
        monkeypatch.setattr(casp_module, name,
                            lambda *a, _real=real, _name=name, **k: projected.append(_name) or _real(*a, **k))
    trainer = vllm_trainer(ckpt, tmp_path, "casp")
    seen = _spy_capture(trainer)
    out = rollout(trainer, wild_sampling_logps(), correction=correction)
    if correction:
        assert seen["rollout"].candidate_ids is not None and out["casp_forking"].any()
    else:
        assert "casp_forking" not in out  # no old-log-prob pass: the loss pass is the rollout policy
    inputs = {k: v for k, v in out.items()}
    inputs["advantages"] = torch.tensor([1.0, -0.5, 2.0, -1.5])
    trainer.compute_loss(trainer.model, inputs).backward()
    assert seen["loss"].candidate_logps is not None
    assert (seen["loss"].candidate_ids is None) == correction  # the rollout's ids, or the loss pass's own top-N
    assert projected == []


@pytest.mark.parametrize("width", [1024, 1024 + 77, 300, 2])
def test_tile_top_is_a_topk(width):
    """`_tile_top` (the largest blocks' maxima, then a `topk` over those blocks) gives a `topk`'s values and columns,
    for tiles of whole blocks, a ragged last chunk and tiles narrower than a block; with ties the same values."""
    g = torch.Generator().manual_seed(width)
    tile = torch.randn(9, width, generator=g)
    k = min(3, width)
    values, columns = _tile_top(tile, k)
    top = tile.topk(k, dim=1)
    assert torch.equal(values, top.values) and torch.equal(columns, top.indices)
    if width == 1024:  # row 0: its three largest values equal, in three blocks; row 1: all three in one block
        tile[0, [5, 300, 900]] = 10.0
        tile[1, [600, 601, 602]] = torch.tensor([9.0, 11.0, 10.0])
        values, columns = _tile_top(tile, k)
        assert values[0].tolist() == [10.0] * 3 and sorted(columns[0].tolist()) == [5, 300, 900]
        assert values[1].tolist() == [11.0, 10.0, 9.0] and columns[1].tolist() == [601, 602, 600]
        assert torch.equal(values, tile.topk(k, dim=1).values)


@pytest.mark.parametrize("vocab,chunk", [(1024 + 77, 512), (2048, 1024)])
def test_folded_top_n_over_whole_blocks_matches_a_dense_topk(vocab, chunk):
    """The folded top-N where tiles are whole blocks of `TOP_BLOCK` columns (and a ragged last chunk), merged
    across vocabulary chunks, equals a dense `topk` of the log-softmax, with the log-probs."""
    g = torch.Generator().manual_seed(vocab)
    h, w = torch.randn(11, 8, generator=g), torch.randn(vocab, 8, generator=g)
    targets = torch.randint(0, vocab, (11,), generator=g)
    out = folded_head(h, w, None, targets, TRLTiles(1.0, chunk, None, 1.0, OUTPUTS), top_n=3)
    logp = torch.log_softmax(h @ w.t(), -1)
    top = logp.topk(3, -1)
    assert torch.equal(out[6], top.indices)
    torch.testing.assert_close(out[5], top.values, rtol=1e-5, atol=1e-5)

"""Hand-worked tests for exploration_trl.core.losses (the arithmetic is in the comments)."""

import math

import pytest
import torch
import torch.nn.functional as Fn
from torch.testing import assert_close

from exploration_trl.core import (
    casp_ratio,
    clip_cov_per_token_loss,
    clip_cov_select,
    forking_mask,
    kl_cov_per_token_loss,
    kl_cov_select,
)

T = torch.tensor
F32 = torch.float32

# ----------------------------------------------------------------------------------------------
# forking_mask
# ----------------------------------------------------------------------------------------------


def test_forking_mask_hand_worked():
    # row 0: sorted [0.1, 0.3, 0.5, 0.9, 2.0]; 0.8 quantile at position 0.8 * 4 = 3.2
    #   thr = 0.9 + 0.2 * (2.0 - 0.9) = 1.12 -> only 2.0 forks
    # row 1: valid [1, 3, 2] (padding 9, 9 ignored); sorted [1, 2, 3], position 1.6
    #   thr = 2 + 0.6 * 1 = 2.6 -> only 3.0 forks
    # row 2: all equal -> thr = 0.5 and "> thr" is strict -> none
    # row 3: one valid token -> thr = its entropy -> none ; row 4: empty -> none
    ent = T(
        [
            [0.1, 0.5, 0.9, 0.3, 2.0],
            [1.0, 3.0, 2.0, 9.0, 9.0],
            [0.5, 0.5, 0.5, 0.5, 0.5],
            [4.0, 9.0, 9.0, 9.0, 9.0],
            [9.0, 9.0, 9.0, 9.0, 9.0],
        ]
    )
    mask = T([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    out = forking_mask(ent, mask)
    expected = torch.zeros(5, 5, dtype=torch.bool)
    expected[0, 4] = True
    expected[1, 1] = True
    assert out.dtype == torch.bool
    assert torch.equal(out, expected)
    # quantile 0.5 on row 0: median 0.5 -> 0.9 and 2.0 fork
    assert out[0].sum() == 1
    assert forking_mask(ent, mask, quantile=0.5)[0].tolist() == [False, False, True, False, True]
    # bf16 entropies (values exact in bf16) give the same mask
    assert torch.equal(forking_mask(ent.bfloat16(), mask), expected)


def test_forking_mask_matches_torch_quantile_per_row():
    g = torch.Generator().manual_seed(3)
    ent = torch.rand(6, 17, generator=g) * 3
    lengths = [17, 1, 0, 5, 12, 2]
    mask = torch.zeros(6, 17)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    out = forking_mask(ent, mask, quantile=0.8)
    for i, n in enumerate(lengths):
        exp = torch.zeros(17, dtype=torch.bool)
        if n:
            thr = torch.quantile(ent[i, :n], 0.8)
            exp[:n] = ent[i, :n] > thr
        assert torch.equal(out[i], exp), i


# ----------------------------------------------------------------------------------------------
# casp_ratio
# ----------------------------------------------------------------------------------------------


def test_casp_ratio_values_and_grads_hand_worked():
    # row 0 has A = 2 (> 0), row 1 has A = -1 (< 0); advantages given as (B,)
    l15, l08 = math.log(1.5), math.log(0.8)
    log_ratio = T([[0.0, l15, l15, 0.0], [l15, l08, 0.0, 0.0]], requires_grad=True)
    topn = torch.zeros(2, 4, 3, requires_grad=True)
    forking = T([[True, True, False, True], [True, True, False, True]])
    is_top1 = T([[True, False, True, True], [True, False, True, True]])
    ratio = casp_ratio(log_ratio, topn, T([2.0, -1.0]), forking, is_top1)
    # values: A > 0 -> r (smoothing changes the gradient only): [1, 1.5, 1.5, 1]
    #   A < 0: (1,0) forking top-1 -> 1.1 * 1.5 = 1.65 ; (1,1) forking not top-1 -> 0.8
    #          (1,2) top-1 not forking -> 1 ; (1,3) forking top-1 -> 1.1
    assert ratio.dtype == F32
    assert_close(ratio.detach(), T([[1.0, 1.5, 1.5, 1.0], [1.65, 0.8, 1.0, 1.1]]))
    ratio.sum().backward()
    # d/d log_ratio: A > 0 forking: (1 - 0.01) * r = 0.99 r ; A > 0 not forking: r
    #                A < 0: 1.1 r on forking top-1, r elsewhere
    assert_close(log_ratio.grad, T([[0.99, 1.485, 1.5, 0.99], [1.65, 0.8, 1.0, 1.1]]))
    # d/d topn: (alpha / N) * r = 0.01 / 3 * r on A > 0 forking tokens, else 0
    a3 = 0.01 / 3
    expected_topn = T([[a3, 1.5 * a3, 0.0, a3], [0.0, 0.0, 0.0, 0.0]]).unsqueeze(-1).expand(2, 4, 3)
    assert_close(topn.grad, expected_topn)


def test_casp_ratio_advantage_shapes_and_bf16():
    lr = T([[0.0, 0.5, -0.5], [0.5, 0.0, 0.25]])
    topn = T([[[0.0, 0.1]] * 3, [[0.2, -0.3]] * 3])  # N = 2
    forking = T([[True, True, False], [True, False, True]])
    is_top1 = T([[True, True, True], [True, True, False]])
    adv = T([1.0, -2.0])
    ref = casp_ratio(lr, topn, adv, forking, is_top1)
    # row 0 (A > 0): exp(lr) ; row 1 (A < 0): (1,0) forking top-1 -> 1.1 e^0.5 ; others e^lr
    assert_close(ref, T([[1.0, math.exp(0.5), math.exp(-0.5)], [1.1 * math.exp(0.5), 1.0, math.exp(0.25)]]))
    assert_close(casp_ratio(lr, topn, adv.unsqueeze(-1), forking, is_top1), ref)
    adv_t = adv.unsqueeze(-1).expand(2, 3).clone()
    adv_t[1, 0] = 0.0  # A == 0 -> plain r (no top-1 penalty)
    out = casp_ratio(lr, topn, adv_t, forking, is_top1)
    assert_close(out[1, 0], T(math.exp(0.5)))
    out = casp_ratio(lr.bfloat16(), topn.bfloat16(), adv.bfloat16(), forking, is_top1)
    assert out.dtype == F32
    assert_close(out, ref)  # 0, +-0.5, 0.25, 0.2, -0.3 rounded to bf16 only touch topn (value-neutral)
    # inputs untouched
    assert_close(lr, T([[0.0, 0.5, -0.5], [0.5, 0.0, 0.25]]))


@pytest.mark.parametrize("alpha", [0.01, 0.3])
def test_casp_ratio_logit_gradient(alpha):
    """Gradient of J = sum(A * ratio) w.r.t. the logits z (Eq. 4 / Eq. 5 of CaSP)."""
    g = torch.Generator().manual_seed(0)
    B, Tn, V, N = 2, 5, 6, 3
    z = torch.randn(B, Tn, V, generator=g).requires_grad_(True)
    old_z = z.detach() + 0.5 * torch.randn(B, Tn, V, generator=g)
    old_logp = torch.log_softmax(old_z, dim=-1)
    top_n = old_logp.topk(N, dim=-1).indices  # (B, T, N), rank 1 first
    top1_pos = T([[True, True, True, True, False], [True, False, False, True, True]])
    y = torch.where(top1_pos, top_n[..., 0], (top_n[..., 0] + 1) % V)
    is_top1 = y == top_n[..., 0]
    assert torch.equal(is_top1, top1_pos)
    forking = T([[True, True, False, True, True], [True, True, True, False, False]])
    A = T([[1.5, -0.7, 0.8, -1.2, 0.0], [-0.5, 2.0, -1.0, 0.3, -0.9]])
    # cases: (0,0) A>0 fork -> smoothed ; (0,1),(0,3),(1,0) A<0 fork top-1 -> 1.1 r
    #        (1,1) A>0 fork not top-1 -> smoothed ; (0,2),(1,3) A>0 no fork -> r
    #        (1,2) A<0 fork not top-1 -> r ; (1,4) A<0 top-1 no fork -> r ; (0,4) A=0

    logp = torch.log_softmax(z, dim=-1)
    log_ratio = logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) - old_logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    topn_log_ratio = logp.gather(-1, top_n) - old_logp.gather(-1, top_n)
    ratio = casp_ratio(log_ratio, topn_log_ratio, A, forking, is_top1, alpha=alpha)
    J = (A * ratio).sum()
    J.backward()

    p = torch.softmax(z.detach(), dim=-1)
    r = log_ratio.detach().exp()
    e_y = Fn.one_hot(y, V).float()
    e_n = Fn.one_hot(top_n, V).float()  # (B, T, N, V)
    plain = e_y - p
    smoothed = (1 - alpha) * (e_y - p) + (alpha / N) * (e_n - p.unsqueeze(-2)).sum(-2)
    pos_fork = (A > 0) & forking
    neg_top1 = (A < 0) & forking & is_top1
    expected = (A * r).unsqueeze(-1) * plain
    expected = torch.where(pos_fork.unsqueeze(-1), (A * r).unsqueeze(-1) * smoothed, expected)
    expected = torch.where(neg_top1.unsqueeze(-1), (A * 1.1 * r).unsqueeze(-1) * plain, expected)
    assert_close(z.grad, expected)
    # the smoothing and the penalty really change the gradient (the test can fail)
    naive = (A * r).unsqueeze(-1) * plain
    assert not torch.allclose(z.grad[pos_fork], naive[pos_fork])
    assert not torch.allclose(z.grad[neg_top1], naive[neg_top1])
    # value equals r wherever A > 0 (and 1.1 r / r elsewhere)
    assert_close(ratio.detach()[A > 0], r[A > 0])
    assert_close(ratio.detach()[neg_top1], 1.1 * r[neg_top1])
    other = ~(A > 0) & ~neg_top1
    assert_close(ratio.detach()[other], r[other])


# ----------------------------------------------------------------------------------------------
# KL-Cov
# ----------------------------------------------------------------------------------------------


def _kl_inputs():
    # mask [[1,1,1],[1,1,0]] -> n_valid = 5 ; A per row [1, -1]
    # token mean of A = (3 * 1 + 2 * (-1)) / 5 = 0.2
    # logps [[-1, -2, -3], [-0.5, -4, pad -99]] -> token mean = (-6 - 4.5) / 5 = -2.1
    # cov = (A - 0.2) * (lp + 2.1):
    #   row 0: 0.8 * [1.1, 0.1, -0.9] = [0.88, 0.08, -0.72]
    #   row 1: -1.2 * [1.6, -1.9]     = [-1.92, 2.28]          (padding would give 116 if counted)
    # order: (1,1)=2.28 > (0,0)=0.88 > (0,1)=0.08 > (0,2)=-0.72 > (1,0)=-1.92
    logps = T([[-1.0, -2.0, -3.0], [-0.5, -4.0, -99.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    adv = T([1.0, -1.0])
    # log ratio d = logps - old_logps: [[0.1, 0, -0.2], [0.3, -0.1, pad]]
    old = logps - T([[0.1, 0.0, -0.2], [0.3, -0.1, 5.0]])
    return logps, old, adv, mask


def test_kl_cov_select_hand_worked():
    logps, _, adv, mask = _kl_inputs()

    def sel(ratio):
        return sorted(map(tuple, kl_cov_select(logps, adv, mask, ratio).nonzero().tolist()))

    assert sel(0.002) == [(1, 1)]  # k = max(1, int(0.01)) = 1
    assert sel(0.2) == [(1, 1)]  # k = int(1.0) = 1
    assert sel(0.4) == [(0, 0), (1, 1)]  # k = int(2.0) = 2
    assert sel(0.6) == [(0, 0), (0, 1), (1, 1)]  # k = int(3.0) = 3
    assert sel(1.0) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]  # every valid token, never padding
    assert sel(0.0) == []  # ratio 0: none
    # (B, 1), (B, T) and bf16 inputs select the same tokens
    assert torch.equal(kl_cov_select(logps, adv.unsqueeze(-1), mask, 0.4), kl_cov_select(logps, adv, mask, 0.4))
    adv_t = adv.unsqueeze(-1).expand(2, 3)
    assert torch.equal(kl_cov_select(logps, adv_t, mask, 0.4), kl_cov_select(logps, adv, mask, 0.4))
    assert torch.equal(
        kl_cov_select(logps.bfloat16(), adv.bfloat16(), mask, 0.4), kl_cov_select(logps, adv, mask, 0.4)
    )
    assert not kl_cov_select(logps, adv, torch.zeros(2, 3), 0.4).any()


def test_kl_cov_loss_values_and_grads():
    logps, old, adv, mask = _kl_inputs()
    lp = logps.clone().requires_grad_(True)
    loss = kl_cov_per_token_loss(lp, old, adv, mask, kl_cov_ratio=0.4)
    # loss = -A e^d (+ |d| on the selected (0,0), (1,1)):
    #   (0,0): -e^0.1 + 0.1 = -1.0051709 ; (0,1): -1 ; (0,2): -e^-0.2 = -0.8187308
    #   (1,0): e^0.3 = 1.3498588 ; (1,1): e^-0.1 + 0.1 = 1.0048374 ; (1,2) padding: 0
    assert loss.dtype == F32
    assert_close(loss.detach(), T([[-1.0051709, -1.0, -0.8187308], [1.3498588, 1.0048374, 0.0]]))
    loss.sum().backward()
    # d/dlp = -A e^d + kl_coef * sign(d) on selected:
    #   (0,0): -1.1051709 + 1 = -0.1051709 ; (0,1): -1 ; (0,2): -0.8187308
    #   (1,0): 1.3498588 ; (1,1): 0.9048374 - 1 = -0.0951626 ; padding: 0
    assert_close(lp.grad, T([[-0.1051709, -1.0, -0.8187308], [1.3498588, -0.0951626, 0.0]]))
    # kl_coef = 2 doubles the penalty: (0,0): -1.1051709 + 0.2 = -0.9051709
    loss2 = kl_cov_per_token_loss(logps, old, adv, mask, kl_cov_ratio=0.4, kl_coef=2.0)
    assert_close(loss2[0, 0], T(-0.9051709))
    # ratio 0: plain -A r everywhere
    loss0 = kl_cov_per_token_loss(logps, old, adv, mask, kl_cov_ratio=0.0)
    assert_close(loss0[0, 0], T(-1.1051709))


def test_kl_cov_penalty_no_gradient_on_policy():
    logps, old, adv, mask = _kl_inputs()
    # on-policy: old == logps.detach() -> d = 0 -> loss -A on valid; penalty gradient d|d|/dd = 0
    lp = logps.clone().requires_grad_(True)
    kl_cov_per_token_loss(lp, lp.detach(), adv, mask, kl_cov_ratio=1.0).sum().backward()
    assert_close(lp.grad, T([[-1.0, -1.0, -1.0], [1.0, 1.0, 0.0]]))
    # off-policy: the penalty adds sign(d) on every selected token (ratio 1 selects all valid)
    lp2 = logps.clone().requires_grad_(True)
    kl_cov_per_token_loss(lp2, old, adv, mask, kl_cov_ratio=1.0).sum().backward()
    lp3 = logps.clone().requires_grad_(True)
    kl_cov_per_token_loss(lp3, old, adv, mask, kl_cov_ratio=0.0).sum().backward()
    diff = lp2.grad - lp3.grad  # sign(d) = [[1, 0, -1], [1, -1, 0 (padding)]]
    assert_close(diff, T([[1.0, 0.0, -1.0], [1.0, -1.0, 0.0]]))


def test_kl_cov_shapes_bf16_empty_inputs_untouched():
    logps, old, adv, mask = _kl_inputs()
    ref = kl_cov_per_token_loss(logps, old, adv, mask, kl_cov_ratio=0.4)
    assert_close(kl_cov_per_token_loss(logps, old, adv.unsqueeze(-1), mask, kl_cov_ratio=0.4), ref)
    assert_close(kl_cov_per_token_loss(logps, old, adv.unsqueeze(-1).expand(2, 3), mask, kl_cov_ratio=0.4), ref)
    # bf16 on-policy: loss is -A on valid tokens, 0 on padding; gradient reaches the bf16 leaf
    lp = logps.bfloat16().requires_grad_(True)
    out = kl_cov_per_token_loss(lp, lp.detach(), adv.bfloat16(), mask)
    assert out.dtype == F32
    assert_close(out.detach(), T([[-1.0, -1.0, -1.0], [1.0, 1.0, 0.0]]))
    out.sum().backward()
    assert lp.grad.dtype == torch.bfloat16
    # empty batch and one-token completion
    assert_close(kl_cov_per_token_loss(logps, old, adv, torch.zeros(2, 3)), torch.zeros(2, 3))
    one = kl_cov_per_token_loss(logps, old, adv, T([[1, 0, 0], [0, 0, 0]]), kl_cov_ratio=0.002)
    # single valid token (0,0) is selected (k = 1): -e^0.1 + 0.1
    assert_close(one, T([[-1.0051709, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    before = [x.clone() for x in (logps, old, adv, mask)]
    kl_cov_per_token_loss(logps, old, adv, mask)
    for x, b in zip((logps, old, adv, mask), before):
        assert torch.equal(x, b)


# ----------------------------------------------------------------------------------------------
# Clip-Cov
# ----------------------------------------------------------------------------------------------


def _clip_inputs():
    # rows 0, 1 fully valid (n_valid = 8), row 2 all padding (A = 5, garbage logps)
    # A per row [2, -2, 5] -> token mean over valid = (4*2 + 4*(-2)) / 8 = 0
    # logps row 0 [-0.5, -1, -3, -3.5], row 1 [-4, -1, -0.5, -2.5] -> token mean -16 / 8 = -2
    # cov = A * (lp + 2):
    #   row 0: 2 * [1.5, 1, -1, -1.5]    = [3, 2, -2, -3]
    #   row 1: -2 * [-2, 1, 1.5, -0.5]   = [4, -2, -3, 1]
    # in (1, 5): (0,0)=3, (0,1)=2, (1,0)=4 ; (1,3)=1 is excluded (strict bound)
    # log ratio d: (0,1) = 0.5 -> r = 1.6487 > 1.2 with A > 0:
    #   pg1 = -3.2974425, pg2 = -2.4 -> pg2 > pg1: already clipped, not a candidate
    # (1,1) d = -0.5 -> r = 0.6065 < 0.8, A < 0: pg1 = 1.2130613, pg2 = 1.6 -> clipped (cov -2 anyway)
    # (1,0) d = -0.1 -> r = 0.9048 inside the range -> not clipped
    # candidates (row-major): [(0,0), (1,0)]
    logps = T([[-0.5, -1.0, -3.0, -3.5], [-4.0, -1.0, -0.5, -2.5], [10.0, 10.0, 10.0, 10.0]])
    d = T([[0.0, 0.5, 0.0, 0.0], [-0.1, -0.5, 0.0, 0.0], [3.0, 3.0, 3.0, 3.0]])
    old = logps - d
    adv = T([2.0, -2.0, 5.0])
    mask = T([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
    return logps, old, adv, mask


def _pairs(sel):
    return sorted(map(tuple, sel.nonzero().tolist()))


def test_clip_cov_select_candidates_and_count():
    logps, old, adv, mask = _clip_inputs()
    # ratio 0.25: min(max(1, int(2.0)), 2) = 2 -> both candidates
    assert _pairs(clip_cov_select(logps, old, adv, mask, clip_cov_ratio=0.25)) == [(0, 0), (1, 0)]
    # ratio 1.0: min(8, 2) = 2 -> still only the two candidates (never clipped (0,1), never padding)
    assert _pairs(clip_cov_select(logps, old, adv, mask, clip_cov_ratio=1.0)) == [(0, 0), (1, 0)]
    # default ratio 2e-4: max(1, int(0.0016)) = 1 token, one of the candidates
    for seed in range(5):
        s = _pairs(clip_cov_select(logps, old, adv, mask, generator=torch.Generator().manual_seed(seed)))
        assert len(s) == 1 and s[0] in [(0, 0), (1, 0)]
    # bounds: (1.5, 3.5) keeps only (0,0)=3 ; lb 0.5 admits (1,3)=1
    assert _pairs(clip_cov_select(logps, old, adv, mask, 1.0, cov_lb=1.5, cov_ub=3.5)) == [(0, 0)]
    assert _pairs(clip_cov_select(logps, old, adv, mask, 1.0, cov_lb=0.5)) == [(0, 0), (1, 0), (1, 3)]
    # wider clip range (eps_high 1.0): r = 1.6487 < 2 is no longer clipped -> (0,1)=2 is a candidate
    assert _pairs(clip_cov_select(logps, old, adv, mask, 1.0, epsilon_high=1.0)) == [(0, 0), (0, 1), (1, 0)]
    # no candidates / empty batch -> nothing
    assert not clip_cov_select(logps, old, adv, mask, 1.0, cov_lb=10.0, cov_ub=20.0).any()
    assert not clip_cov_select(logps, old, adv, torch.zeros(3, 4), 1.0).any()


def test_clip_cov_select_seeded_reproducible():
    logps, old, adv, mask = _clip_inputs()
    seen = set()
    for seed in range(20):
        a = clip_cov_select(logps, old, adv, mask, 0.125, generator=torch.Generator().manual_seed(seed))
        b = clip_cov_select(logps, old, adv, mask, 0.125, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(a, b)
        # the draw is randperm over the row-major candidate list [(0,0), (1,0)]
        first = torch.randperm(2, generator=torch.Generator().manual_seed(seed))[0].item()
        assert _pairs(a) == [[(0, 0), (1, 0)][first]]
        seen.add(_pairs(a)[0])
    assert seen == {(0, 0), (1, 0)}  # random, not always the same token


def test_clip_cov_loss_values_and_grads():
    logps, old, adv, mask = _clip_inputs()
    lp = logps.clone().requires_grad_(True)
    loss = clip_cov_per_token_loss(lp, old, adv, mask, clip_cov_ratio=0.25)
    # selected (0,0), (1,0) -> 0 ; (0,1): max(-3.2974425, -2.4) = -2.4 ; (0,2), (0,3): -2
    # (1,1): max(1.2130613, 1.6) = 1.6 ; (1,2), (1,3): 2 ; padding row: 0
    assert loss.dtype == F32
    assert_close(loss.detach(), T([[0.0, -2.4, -2.0, -2.0], [0.0, 1.6, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0]]))
    loss.sum().backward()
    # gradient -A r on unclipped, unselected tokens; 0 on selected, clipped and padding tokens
    assert_close(lp.grad, T([[0.0, 0.0, -2.0, -2.0], [0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0]]))


def test_clip_cov_loss_one_selected_token_has_zero_grad():
    logps, old, adv, mask = _clip_inputs()
    gen_seed = 7
    sel = clip_cov_select(logps, old, adv, mask, generator=torch.Generator().manual_seed(gen_seed))
    lp = logps.clone().requires_grad_(True)
    loss = clip_cov_per_token_loss(lp, old, adv, mask, generator=torch.Generator().manual_seed(gen_seed))
    loss.sum().backward()
    assert sel.sum() == 1
    assert lp.grad[sel].item() == 0.0 and loss.detach()[sel].item() == 0.0
    other = [(0, 0), (1, 0)]
    other.remove(_pairs(sel)[0])
    # the unselected candidate keeps its gradient -A r: (0,0): -2 * 1 ; (1,0): 2 * e^-0.1 = 1.8096749
    expected = {(0, 0): -2.0, (1, 0): 1.8096749}[other[0]]
    assert_close(lp.grad[other[0]], T(expected))


def test_clip_cov_shapes_bf16_empty_inputs_untouched():
    logps, old, adv, mask = _clip_inputs()
    ref = clip_cov_per_token_loss(logps, old, adv, mask, clip_cov_ratio=0.25)
    assert_close(clip_cov_per_token_loss(logps, old, adv.unsqueeze(-1), mask, clip_cov_ratio=0.25), ref)
    assert_close(clip_cov_per_token_loss(logps, old, adv.unsqueeze(-1).expand(3, 4), mask, clip_cov_ratio=0.25), ref)
    # bf16 log-probs (all exact in bf16), on-policy: no clipping, loss -A on unselected valid tokens
    lp = logps.bfloat16().requires_grad_(True)
    out = clip_cov_per_token_loss(lp, lp.detach(), adv.bfloat16(), mask, clip_cov_ratio=1.0)
    # on-policy nothing is clipped -> candidates (0,0)=3, (0,1)=2, (1,0)=4 all dropped
    assert out.dtype == F32
    assert_close(out.detach(), T([[0.0, 0.0, -2.0, -2.0], [0.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0]]))
    out.sum().backward()
    assert lp.grad.dtype == torch.bfloat16
    # empty batch: all zero
    assert_close(clip_cov_per_token_loss(logps, old, adv, torch.zeros(3, 4)), torch.zeros(3, 4))
    # one-token completion: cov is 0 (a single token is its own mean) -> no candidate -> -A r
    one = clip_cov_per_token_loss(logps, old, adv, T([[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert_close(one, T([[-2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    before = [x.clone() for x in (logps, old, adv, mask)]
    clip_cov_per_token_loss(logps, old, adv, mask)
    for x, b in zip((logps, old, adv, mask), before):
        assert torch.equal(x, b)

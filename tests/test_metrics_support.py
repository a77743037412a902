import math

import numpy as np
import pytest
import torch

from exploration_trl.metrics import (
    branching_factor,
    entropy_by_correctness,
    expected_distinct_tokens,
    lambda_n,
    lambda_sample,
    rank_logprobs,
    token_entropy_stats,
)

PAD = 100.0  # large value in padded slots: any leak through the mask changes the results


def _ent():
    # completion 0: valid [1, 2, 3]; completion 1: valid [4, 5]; completion 2: valid [6]
    ent = torch.tensor([[1.0, 2.0, 3.0, PAD], [4.0, 5.0, PAD, PAD], [6.0, PAD, PAD, PAD]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    return ent, mask


# ----------------------------------------------------------------------------- entropy statistics
def test_token_entropy_stats_hand_worked():
    ent, mask = _ent()
    s = token_entropy_stats(ent[:2], mask[:2])
    # valid tokens 1, 2, 3, 4, 5
    assert s["count"] == 5
    assert s["mean"] == pytest.approx(3.0)  # 15 / 5
    assert s["std"] == pytest.approx(math.sqrt(2.0))  # population var = (4+1+0+1+4)/5 = 2
    assert s["median"] == pytest.approx(3.0)
    assert s["p90"] == pytest.approx(4.6)  # position 0.9*(5-1)=3.6 -> 4 + 0.6*(5-4)
    assert s["max"] == pytest.approx(5.0)
    assert all(isinstance(s[k], float) for k in ("mean", "std", "median", "p90", "max"))
    # 0/1 integer mask works like a bool mask
    assert token_entropy_stats(ent[:2], mask[:2].long())["mean"] == pytest.approx(3.0)


def test_token_entropy_stats_empty_and_shape_mismatch():
    ent, mask = _ent()
    s = token_entropy_stats(ent, torch.zeros_like(mask))
    assert s["count"] == 0 and all(math.isnan(s[k]) for k in ("mean", "std", "median", "p90", "max"))
    with pytest.raises(ValueError, match="mask shape"):
        token_entropy_stats(ent, mask[:, :2])


def test_entropy_by_correctness_is_token_weighted():
    ent, mask = _ent()
    out = entropy_by_correctness(ent, mask, torch.tensor([True, False, True]))
    # correct: completions 0 and 2 -> tokens 1,2,3,6 -> 12/4 = 3.0
    # (a per-completion mean would give (2 + 6)/2 = 4.0)
    assert out["correct"] == pytest.approx(3.0)
    # wrong: completion 1 -> (4 + 5)/2 = 4.5
    assert out["wrong"] == pytest.approx(4.5)
    out = entropy_by_correctness(ent, mask, [1, 1, 1])
    assert out["correct"] == pytest.approx(21 / 6)  # (1+2+3+4+5+6)/6
    assert math.isnan(out["wrong"])
    with pytest.raises(ValueError):
        entropy_by_correctness(ent, mask, [True, False])


# ----------------------------------------------------------------------------- branching factor
def _logp(rows):
    return torch.log(torch.tensor(rows, dtype=torch.float32))


def test_branching_factor_hand_made():
    # row 0 (shuffled on purpose): sorted 0.5, 0.3, 0.15, 0.05 -> cumulative 0.5, 0.8, 0.95, 1.0
    # row 1: uniform over 4 -> cumulative 0.25, 0.5, 0.75, 1.0
    # row 2: one-hot (log 0 = -inf) -> 1
    lp = _logp([[0.15, 0.5, 0.05, 0.3], [0.25] * 4, [0.0, 1.0, 0.0, 0.0]])
    bf = branching_factor(lp, top_p=0.95)
    assert bf.dtype == torch.long and bf.shape == (3,)
    assert bf.tolist() == [3, 4, 1]  # 0.95 reached after 3 tokens / 4 tokens / 1 token
    assert branching_factor(lp, top_p=0.8).tolist() == [2, 4, 1]  # exact boundary 0.5+0.3
    assert branching_factor(lp, top_p=0.81).tolist() == [3, 4, 1]
    assert branching_factor(lp, top_p=0.5).tolist() == [1, 2, 1]
    assert branching_factor(lp, top_p=0.3).tolist() == [1, 2, 1]
    assert branching_factor(lp, top_p=1.0).tolist() == [4, 4, 1]


def test_branching_factor_matches_bruteforce_and_batch_dims():
    torch.manual_seed(0)
    lp = torch.randn(2, 5, 50).mul(3).log_softmax(-1)
    bf = branching_factor(lp, top_p=0.9)
    assert bf.shape == (2, 5)
    p = lp.double().exp().numpy()
    for idx in np.ndindex(2, 5):
        cum = np.cumsum(np.sort(p[idx])[::-1])
        assert bf[idx].item() == int(np.argmax(cum >= 0.9 - 1e-6)) + 1
    with pytest.raises(ValueError):
        branching_factor(lp, top_p=0.0)


def _sorted_count(lp, top_p, atol=1e-6):
    """The definition: sort descending, cumulative sum (float64), count until top_p is reached."""
    p = lp.double().exp().sort(dim=-1, descending=True).values.cumsum(-1)
    return ((p < top_p - atol).sum(-1) + 1).clamp(max=lp.shape[-1])


@pytest.mark.parametrize("vocab", [50, 1000, 32768])
def test_branching_factor_equals_the_sorted_definition_on_many_shapes(vocab):
    g = torch.Generator().manual_seed(vocab)
    rows = [
        torch.randn(8, vocab, generator=g) * 0.02,  # nearly flat (an untrained model): ~0.95 V
        torch.randn(8, vocab, generator=g) * 3.0,  # moderately peaked: hundreds of candidates
        torch.randn(8, vocab, generator=g) * 12.0,  # peaked (a trained model): settled by the top-k head
        torch.zeros(2, vocab),  # exactly uniform: every token in one bucket
    ]
    ties = torch.randint(0, 4, (4, vocab), generator=g).float()  # only 4 distinct values per row
    rows.append(ties)
    holes = torch.randn(4, vocab, generator=g)
    holes[:, ::3] = -float("inf")  # zero-probability tokens
    rows.append(holes)
    lp = torch.cat(rows).log_softmax(-1)
    for top_p in (0.5, 0.9, 0.95, 1.0):
        expected = _sorted_count(lp, top_p)
        assert torch.equal(branching_factor(lp, top_p=top_p), expected), top_p


# ----------------------------------------------------------------------------- rank log-probs / Λ
def test_rank_logprobs_and_lambda():
    lp = _logp([[0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.5, 0.25, 0.25]])
    r = rank_logprobs(lp, n=3)
    assert r.shape == (3, 3)
    expected = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.6, 0.2, 0.2], [0.5, 0.25, 0.25]]))
    torch.testing.assert_close(r, expected)
    torch.testing.assert_close(rank_logprobs(lp, n=1), expected[:, :1])
    with pytest.raises(ValueError):
        rank_logprobs(lp, n=4)

    mask = torch.tensor([True, True, False])
    lam = lambda_n(r, mask)
    # Λ(1) = (log .6 + log .6)/2, Λ(2) = (log .3 + log .2)/2, Λ(3) = (log .1 + log .2)/2
    assert lam == pytest.approx(
        [math.log(0.6), (math.log(0.3) + math.log(0.2)) / 2, (math.log(0.1) + math.log(0.2)) / 2], rel=1e-6
    )
    assert lambda_n(r, None)[0] == pytest.approx((2 * math.log(0.6) + math.log(0.5)) / 3, rel=1e-6)
    # (B, T, n) layout with a (B, T) mask
    lam_bt = lambda_n(r.reshape(1, 3, 3), mask.reshape(1, 3))
    assert lam_bt == pytest.approx(lam)
    assert all(math.isnan(v) for v in lambda_n(r, torch.zeros(3, dtype=torch.bool)))


def test_lambda_sample():
    sampled = torch.tensor([[-0.1, -2.0, -50.0], [-0.5, -50.0, -50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # (-0.1 - 2.0 - 0.5) / 3 = -2.6 / 3
    assert lambda_sample(sampled, mask) == pytest.approx(-2.6 / 3)
    assert math.isnan(lambda_sample(sampled, torch.zeros_like(mask)))


# ----------------------------------------------------------------------------- expected distinct tokens
def test_expected_distinct_tokens_hand_worked():
    lp = _logp([[0.5, 0.5, 0.0], [0.9, 0.1, 0.0], [1.0, 0.0, 0.0]])
    # K=2: row 0: 2 * (1 - 0.5^2) = 1.5 ; row 1: (1 - 0.1^2) + (1 - 0.9^2) = 0.99 + 0.19 = 1.18 ; row 2: 1
    out = expected_distinct_tokens(lp, 2)
    assert out.shape == (3,)
    torch.testing.assert_close(out, torch.tensor([1.5, 1.18, 1.0], dtype=torch.float64), rtol=1e-6, atol=1e-6)
    # K=3: row 1: (1 - 0.1^3) + (1 - 0.9^3) = 0.999 + 0.271 = 1.27
    assert expected_distinct_tokens(lp, 3)[1].item() == pytest.approx(1.27, rel=1e-6)
    # K=1: total probability mass = 1 for every row
    torch.testing.assert_close(expected_distinct_tokens(lp, 1), torch.ones(3, dtype=torch.float64))
    # K -> infinity: support size (2, 2, 1); zero-probability tokens never count
    torch.testing.assert_close(
        expected_distinct_tokens(lp, 10_000), torch.tensor([2.0, 2.0, 1.0], dtype=torch.float64)
    )


def test_expected_distinct_tokens_stable_for_tiny_and_near_one_probs():
    # a single token with p = 1e-18 (below float64 eps) and K = 1e6 draws:
    # 1 - (1 - 1e-18)^1e6 = 1e-12 (to ~1e-24); the naive 1 - (1 - p)**K gives exactly 0
    lp = torch.tensor([[math.log(1e-18)]], dtype=torch.float64)
    assert expected_distinct_tokens(lp, 1_000_000).item() == pytest.approx(1e-12, rel=1e-9, abs=0)
    assert (1 - (1 - lp.exp()) ** 1_000_000).item() == 0.0  # what the naive formula returns
    # near-one probability: p = 1 - 1e-15 and K = 2 -> 1 - (1e-15)^2 = 1 (no NaN from log(0)-like terms)
    lp1 = torch.tensor([[math.log1p(-1e-15), math.log(1e-15)]], dtype=torch.float64)
    # contributions: (1 - 1e-30) + (1 - (1 - 1e-15)^2 ~= 2e-15) = 1 + 2e-15 - 1e-30
    assert expected_distinct_tokens(lp1, 2).item() - 1.0 == pytest.approx(2e-15, rel=0.2, abs=0)
    # per-token precision near p = 1: with 1 - p = 1e-14 and K = 0.5 the term is 1 - sqrt(1e-14) = 1 - 1e-7;
    # forming 1 - exp(log p) would get 1 - p only to ~1% and the term to ~5e-10
    lp_one = torch.tensor([[math.log1p(-1e-14)]], dtype=torch.float64)
    assert expected_distinct_tokens(lp_one, 0.5).item() == pytest.approx(1 - 1e-7, rel=0, abs=1e-13)
    # float32 input with an exact zero-probability token: finite result
    out = expected_distinct_tokens(_logp([[1.0, 0.0]]), 3)
    assert torch.isfinite(out).all() and out.item() == pytest.approx(1.0)


def test_expected_distinct_tokens_matches_naive_formula():
    torch.manual_seed(1)
    lp = torch.randn(4, 3, 64, dtype=torch.float64).mul(2).log_softmax(-1)
    for K in (1, 4, 16, 7.5):
        naive = (1 - (1 - lp.exp()) ** K).sum(-1)
        torch.testing.assert_close(expected_distinct_tokens(lp, K), naive, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError):
        expected_distinct_tokens(lp, 0)


def test_branching_factor_reuses_a_callers_ordering_and_ignores_a_short_one():
    """`token_statistics` hands its own top-64 ordering over; the count is the sorted definition's either way."""
    g = torch.Generator().manual_seed(7)
    lp = (torch.randn(6, 5000, generator=g) * torch.tensor([0.02, 0.5, 2.0, 4.0, 8.0, 16.0])[:, None]).log_softmax(-1)
    expected = _sorted_count(lp, 0.9)
    assert torch.equal(branching_factor(lp, top_p=0.9, top_values=lp.topk(64, dim=-1).values), expected)
    assert torch.equal(branching_factor(lp, top_p=0.9, top_values=lp.topk(80, dim=-1).values), expected)
    assert torch.equal(branching_factor(lp, top_p=0.9, top_values=lp.topk(3, dim=-1).values), expected)  # too few

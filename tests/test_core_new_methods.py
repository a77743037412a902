"""The 0.8.0 methods' core functions against hand-worked numbers from their papers' equations, and against the
numbers their authors' code gives on the same inputs (where there is code: MaxRL, W-REINFORCE, QAE).

The "official code" values below were computed by re-implementing, line by line, the authors' advantage functions
(MaxRL: `compute_maxrl_outcome_advantage` in tajwarfahim/maxrl's `verl/trainer/ppo/core_algos.py`; W-REINFORCE:
`compute_psr_nsr_outcome_advantage` in TianHongZXY/RLVR-Decomposed; QAE: verl's `compute_grpo_outcome_advantage`
with the mean replaced by `torch.quantile(scores, quantile_k)`, the one-line change junkangwu/QAE's README gives)
in float32 torch, and are written here as numbers; docs/methods.md says where the defaults differ from that code.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from torch.testing import assert_close

from exploration_trl.core import bonuses, estimators

# Groups of 4 used throughout: two right of four, one of four, none, all.
REWARDS4 = [1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# ------------------------------------------------------------------------------------------------------- MaxRL
def test_maxrl_is_algorithm_1_exactly_with_eps_0():
    # Algorithm 1: A = (r - r_hat) / r_hat, 0 when r_hat = 0. K correct of N: correct N/K - 1, wrong -1.
    # [1,0,0,1]: r_hat 1/2 -> +1, -1; [1,0,0,0]: r_hat 1/4 -> 3, -1; [0]*4 -> 0; [1]*4 -> 0.
    adv = estimators.maxrl_advantages(t(REWARDS4).bool(), 4, eps=0.0)
    assert adv.tolist() == [1, -1, -1, 1, 3, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0]


def test_maxrl_default_eps_gives_the_authors_code_numbers():
    adv = estimators.maxrl_advantages(t(REWARDS4).bool(), 4)  # eps 1e-6, as the authors' code and App. F
    official = [0.999998, -0.999998, -0.999998, 0.999998, 2.999988, -0.999996, -0.999996, -0.999996] + [0.0] * 8
    assert_close(adv, t(official), rtol=0, atol=1e-6)
    # G = 8, one correct: 7 and -1 (code: 6.999944, -0.999992).
    adv8 = estimators.maxrl_advantages(t([1] + [0] * 7).bool(), 8)
    assert_close(adv8, t([6.999944] + [-0.999992] * 7), rtol=0, atol=1e-6)


def test_maxrl_one_sample_group_gets_zero():
    # G = 1: each row is its own group, r_hat = r, so r - r_hat = 0 (correct) and r_hat = 0 (wrong): 0 either way.
    # The authors' code gives a group of one r / 1e-6 (1,000,000 for a correct one); docs/methods.md says why not.
    assert estimators.maxrl_advantages(t([1, 0, 1]).bool(), 1).tolist() == [0.0, 0.0, 0.0]
    # A group of 4 left with one scored completion: the same, and the mixed group beside it keeps 3, -1.
    valid = t([1, 0, 0, 0, 1, 1, 1, 1]).bool()
    adv = estimators.maxrl_advantages(t([1, 0, 0, 0, 1, 0, 0, 0]).bool(), 4, valid=valid, eps=0.0)
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0, 3.0, -1.0, -1.0, -1.0]


def test_maxrl_leaves_unscored_rows_out_of_the_mean():
    # [1, NaN, 0, 0]: r_hat over the 3 scored rows = 1/3 -> correct 2, wrong -1; the unscored row 0.
    valid = t([1, 0, 1, 1]).bool()
    adv = estimators.maxrl_advantages(t([1, 0, 0, 0]).bool(), 4, valid=valid, eps=0.0)
    assert_close(adv, t([2.0, 0.0, -1.0, -1.0]))


# ------------------------------------------------------------------------------------------------- W-REINFORCE
def test_weighted_reinforce_is_lambda_for_correct_and_minus_one_for_wrong():
    adv = estimators.weighted_reinforce_advantages(t(REWARDS4).bool(), positive_weight=0.1)
    # No baseline: all-wrong and all-correct groups still get -1 and +0.1 (the authors' code: the same numbers).
    expected = [0.1, -1, -1, 0.1, 0.1, -1, -1, -1, -1, -1, -1, -1, 0.1, 0.1, 0.1, 0.1]
    assert_close(adv, t(expected))


@pytest.mark.parametrize("mode, correct_adv, wrong_adv", [("psr", 1.0, 0.0), ("nsr", 0.0, -1.0),
                                                          ("weighted", 0.25, -1.0)])
def test_weighted_reinforce_psr_and_nsr_forms(mode, correct_adv, wrong_adv):
    valid = t([1, 1, 0, 1]).bool()
    adv = estimators.weighted_reinforce_advantages(t([1, 0, 1, 0]).bool(), valid, positive_weight=0.25, mode=mode)
    assert adv.tolist() == [correct_adv, wrong_adv, 0.0, wrong_adv]  # the unscored row gets 0


def test_weighted_reinforce_names_the_modes():
    with pytest.raises(ValueError, match="mode is 'both'; choose one of weighted, psr, nsr"):
        estimators.weighted_reinforce_advantages(t([1, 0]).bool(), mode="both")


# ------------------------------------------------------------------------------------------------------- QAE
def _bessel_std(values):
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def test_qae_paper_quantile_on_binary_groups():
    # K = 0.4, G = 4: b_K = the ceil(1.6) = 2nd smallest reward.
    # [1,0,0,1]: sorted 0,0,1,1 -> b = 0: correct 1/std, wrong 0; std = sqrt(4/3 * 1/4) = 0.57735.
    # [1,0,0,0]: b = 0 -> correct 1/std with std = 0.5; [0]*4 and [1]*4: 0.
    eps = 1e-4
    adv = estimators.quantile_advantages(t(REWARDS4), 4, k=0.4)
    s2, s1 = _bessel_std([1, 0, 0, 1]), _bessel_std([1, 0, 0, 0])
    expected = [1 / (s2 + eps), 0, 0, 1 / (s2 + eps), 1 / (s1 + eps), 0, 0, 0] + [0.0] * 8
    assert_close(adv, t(expected))
    # Easy group (5 of 8 correct, more than 1 - K): b = 1, only the wrong ones move: -1/std.
    easy = estimators.quantile_advantages(t([1, 1, 1, 1, 1, 0, 0, 0]), 8, k=0.4)
    s = _bessel_std([1, 1, 1, 1, 1, 0, 0, 0])
    assert_close(easy, t([0.0] * 5 + [-1 / (s + eps)] * 3))


def test_qae_linear_quantile_gives_the_authors_code_numbers():
    # The authors' code: torch.quantile (linear), unbiased std, eps 1e-6.
    adv = estimators.quantile_advantages(t(REWARDS4), 4, k=0.4, method="linear", eps=1e-6)
    official = [1.385638, -0.346410, -0.346410, 1.385638, 1.999996, 0.0, 0.0, 0.0] + [0.0] * 8
    assert_close(adv, t(official), rtol=0, atol=2e-6)
    easy = estimators.quantile_advantages(t([1, 1, 1, 1, 1, 0, 0, 0]), 8, k=0.4, method="linear", eps=1e-6)
    assert_close(easy, t([0.386436] * 5 + [-1.545744] * 3), rtol=0, atol=2e-6)
    one = estimators.quantile_advantages(t([1, 0, 0, 0, 0, 0, 0, 0]), 8, k=0.4, method="linear", eps=1e-6)
    assert_close(one, t([2.828419] + [0.0] * 7), rtol=0, atol=2e-6)


def test_qae_paper_and_code_agree_where_k_times_g_minus_one_is_whole():
    # K = 0.4, G = 16 (the paper's runs): 0.4 * 15 = 6, so both quantiles are the 7th smallest for every count.
    for c in range(17):
        r = t([1.0] * c + [0.0] * (16 - c))
        paper = estimators.quantile_advantages(r, 16, k=0.4)
        code = estimators.quantile_advantages(r, 16, k=0.4, method="linear")
        assert_close(paper, code)


def test_qae_rank_is_exact_for_every_group_size_and_level():
    """Every n <= 128 (a group of 128 with 128 - n unscored rows) and K = 0.001, ..., 0.999: the baseline is the
    ceil(K n)-th smallest scored reward, ceil taken in exact rational arithmetic. The rewards 1..n make the baseline
    the rank itself: with scale "none" the row holding 1 gets 1 - rank."""
    g = 128
    rows = torch.full((g, g), float("nan"))
    for n in range(1, g + 1):
        rows[n - 1, :n] = torch.arange(1, n + 1, dtype=torch.float32)
    wrong = []
    for i in range(1, 1000):
        level = Fraction(i, 1000)
        exact = [math.ceil(level * n) for n in range(1, g + 1)]
        adv = estimators.quantile_advantages(rows.reshape(-1), g, k=i / 1000, scale="none").view(g, g)
        got = (1 - adv[:, 0]).tolist()
        wrong += [(n, i / 1000, got[n - 1], exact[n - 1]) for n in range(1, g + 1) if got[n - 1] != exact[n - 1]]
    assert wrong == []  # a float32 k * n put 17 of these one rank too high, e.g. (25, 0.6), (45, 0.6), (50, 0.3)


@pytest.mark.parametrize("n, k, correct", [(25, 0.6, 10), (45, 0.6, 18), (50, 0.3, 35), (100, 0.15, 85)])
def test_qae_binary_groups_at_the_boundary(n, k, correct):
    # correct = (1 - K) n exactly: the share of correct completions is 1 - K, so the paper's baseline is 0 (only the
    # correct completions move, up); one more correct completion and it is 1 (only the wrong ones, down). The group is
    # padded to 128 with unscored rows, as unscored completions leave n < G in training.
    def adv(c):
        r = t([1.0] * c + [0.0] * (n - c) + [float("nan")] * (128 - n))
        return estimators.quantile_advantages(r, 128, k=k, scale="none")

    at = adv(correct)
    assert at[:correct].tolist() == [1.0] * correct and at[correct:].tolist() == [0.0] * (128 - correct)
    above = adv(correct + 1)
    assert above[:n].tolist() == [0.0] * (correct + 1) + [-1.0] * (n - correct - 1)


def test_qae_one_scored_completion_gets_zero():
    # Its quantile is its own reward: 0 whatever the scale (verl's code gives a group of one its reward, mean 0 and
    # std 1 there). G = 1 is the same.
    nan = float("nan")
    for scale in ("group", "batch", "none"):
        r = t([1.0, nan, nan, nan, 1.0, 0.0, 0.0, 0.0])
        adv = estimators.quantile_advantages(r, 4, k=0.4, scale=scale)
        assert adv[:4].tolist() == [0.0] * 4 and adv[4].item() > 0, scale
        assert estimators.quantile_advantages(t([1.0, 0.0]), 1, scale=scale).tolist() == [0.0, 0.0]


def test_qae_graded_rewards_scale_and_unscored_rows():
    # Rewards [0.2, NaN, 0.8, 0.5]: scored 0.2, 0.5, 0.8; K=0.5 -> ceil(1.5) = 2nd smallest = 0.5; scale none.
    adv = estimators.quantile_advantages(t([0.2, float("nan"), 0.8, 0.5]), 4, k=0.5, scale="none")
    assert_close(adv, t([-0.3, 0.0, 0.3, 0.0]))
    with pytest.raises(ValueError, match=r"k is 1.0; the quantile level must lie in \(0, 1\)"):
        estimators.quantile_advantages(t([0.0, 1.0]), 2, k=1.0)


# ------------------------------------------------------------------------------------------- entropy advantage
def test_entropy_shaped_advantages_hand_worked():
    # Eq. 5/6 with alpha 0.4, kappa 2: psi = min(0.4 H, |A| / 2).
    # Row A = 1.5 (cap 0.75): H 0.1, 2.0, 5.0 -> psi 0.04, 0.75, 0.75.
    # Row A = -0.5 (cap 0.25): H 0.3, 1.2, 0.0 -> psi 0.12, 0.25, 0; the sign never flips.
    adv = t([1.5, -0.5])
    h = t([[0.1, 2.0, 5.0], [0.3, 1.2, 0.0]])
    shaped = bonuses.entropy_shaped_advantages(adv, h, torch.ones(2, 3))
    assert_close(shaped, t([[1.54, 2.25, 2.25], [-0.38, -0.25, -0.5]]))
    # The PPO setting alpha = 0.1; padding keeps A; a zero advantage stays 0.
    mask = t([[1, 1, 0], [1, 1, 1]])
    shaped = bonuses.entropy_shaped_advantages(t([1.5, 0.0]), h, mask, alpha=0.1)
    assert_close(shaped, t([[1.51, 1.7, 1.5], [0.0, 0.0, 0.0]]))


def test_entropy_shaped_advantages_do_not_carry_the_entropy_gradient():
    h = t([[1.0, 2.0]]).requires_grad_()
    shaped = bonuses.entropy_shaped_advantages(t([1.0]), h, torch.ones(1, 2))
    assert not shaped.requires_grad
    with pytest.raises(ValueError, match="kappa is 1.0; it must be > 1"):
        bonuses.entropy_shaped_advantages(t([1.0]), h, torch.ones(1, 2), kappa=1.0)


# -------------------------------------------------------------------------------------------- outcome bonuses
def test_outcome_ucb_bonus_hand_worked():
    # Prior counts {"3": 5, "7": 1}; answers "3", "7", "9" (new), none. b = min(1, 1/sqrt(N)): 1/sqrt(5) = 0.447214,
    # 1, 1 (N = 0: the cap), and 0 for the row without an answer.
    counts, has = t([5, 1, 0, 0]), t([1, 1, 1, 0]).bool()
    assert_close(bonuses.outcome_ucb_bonus(counts, has, 4, baseline="none"), t([1 / math.sqrt(5), 1.0, 1.0, 0.0]))
    # UCB-Con with b0 = 0.5.
    assert_close(bonuses.outcome_ucb_bonus(counts, has, 4, baseline="constant", b0=0.5),
                 t([1 / math.sqrt(5) - 0.5, 0.5, 0.5, 0.0]))
    # UCB-Mean: minus the mean over the three answered rows, (0.447214 + 2) / 3.
    mean = (1 / math.sqrt(5) + 2) / 3
    assert_close(bonuses.outcome_ucb_bonus(counts, has, 4, baseline="mean"),
                 t([1 / math.sqrt(5) - mean, 1 - mean, 1 - mean, 0.0]))
    # Leave-one-out: each minus the mean of the group's other answered rows: 0.447214 - 1, 1 - 0.723607 (twice).
    other = (1 / math.sqrt(5) + 1) / 2
    assert_close(bonuses.outcome_ucb_bonus(counts, has, 4, baseline="mean_loo"),
                 t([1 / math.sqrt(5) - 1, 1 - other, 1 - other, 0.0]))


def test_outcome_ucb_mean_over_the_batch_or_leave_one_out():
    # Two groups of 2. Counts 1, 4 | 0, none: bonuses 1, 0.5 | 1, -. Group means 0.75 | 1; the batch's mean over the
    # three answered rows 2.5 / 3; leave-one-out 0.5, 1 | the lone answered row of the second group gets 0.
    counts, has = t([1, 4, 0, 0]), t([1, 1, 1, 0]).bool()
    assert bonuses.outcome_ucb_bonus(counts, has, 2, baseline="mean").tolist() == [0.25, -0.25, 0.0, 0.0]
    assert_close(bonuses.outcome_ucb_bonus(counts, has, 2, baseline="mean_batch"),
                 t([1 - 2.5 / 3, 0.5 - 2.5 / 3, 1 - 2.5 / 3, 0.0]))
    assert bonuses.outcome_ucb_bonus(counts, has, 2, baseline="mean_loo").tolist() == [0.5, -0.5, 0.0, 0.0]
    with pytest.raises(ValueError, match="baseline is 'median'; choose one of none, constant, mean, mean_batch, "
                                         "mean_loo"):
        bonuses.outcome_ucb_bonus(counts, has, 2, baseline="median")


def test_outcome_batch_penalty_hand_worked():
    # Answers 3, 3, 3, 7 in a group of 4: each "3" matches 2 others -> -2/4; "7" matches none.
    assert_close(bonuses.outcome_batch_penalty(torch.tensor([3, 3, 3, 7]), torch.ones(4, dtype=torch.bool), 4),
                 t([-0.5, -0.5, -0.5, 0.0]))
    # Rows without an answer neither get nor cause a penalty (their ids are ignored); groups are separate.
    ids, has = torch.tensor([5, 0, 5, 0, 5, 5, 1, 2]), t([1, 0, 1, 0, 1, 1, 1, 1]).bool()
    assert_close(bonuses.outcome_batch_penalty(ids, has, 4), t([-0.25, 0.0, -0.25, 0.0, -0.25, -0.25, 0.0, 0.0]))

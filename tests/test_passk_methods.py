"""Pass@k-objective methods: Pass@k Training (`passk`), PKPO (`pkpo`), the unlikeliness reward (`unlikely`).

Each formula is checked against hand-worked numbers and against an independent brute-force implementation written
here (enumerating every k-subset of a group); each trainer logs its metrics, acts, composes with a loss-side method,
and trains exactly as TRL's GRPOTrainer at its neutral setting.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

import exploration_trl as et
from exploration_trl.core.advantages import group_advantages
from exploration_trl.core.passk import (
    passk_advantages,
    pkpo_advantages,
    pkpo_k_at_step,
    pkpo_transform,
    unlikeliness_rewards,
)
from helpers import binary_reward, max_param_diff, params_changed, toy_checkpoint, train


# ----------------------------------------------------------------------------- brute force, written independently
def brute_passk(correct: list[bool], k: int) -> list[float]:
    """Chen et al.'s construction itself: every k-subset gets reward max (1 if any correct), subset advantages are
    (R_S - mean) / population std over all subsets, and a response's advantage is the mean over its subsets."""
    n = len(correct)
    subsets = list(itertools.combinations(range(n), k))
    rew = {s: float(any(correct[i] for i in s)) for s in subsets}
    mean = sum(rew.values()) / len(subsets)
    std = math.sqrt(sum((r - mean) ** 2 for r in rew.values()) / len(subsets))
    out = []
    for i in range(n):
        mine = [s for s in subsets if i in s]
        out.append(sum((rew[s] - mean) / (std + 1e-6) for s in mine) / len(mine))
    return out


def paper_S(g: list[float], i: int, k: int, pool: list[int]) -> float:
    """PKPO's S(i, k, X) (Eq. 27-28; Eq. 31 for X of n - 1 elements): the sum over the k-subsets of X containing i
    of their max reward, over C(|X|, k)."""
    subsets = [s for s in itertools.combinations(pool, k) if i in s]
    return sum(max(g[j] for j in s) for s in subsets) / math.comb(len(pool), k)


def brute_pkpo(g: list[float], k: int, estimator: str) -> list[float]:
    """The paper's estimators at its own scale, by enumeration: s_i (Eq. 19/27), s_i^(loo) (Eq. 29),
    s_i^(loo-1) (Eq. 33); at k = 1 the minus-one variant is the leave-one-out mean centring of Eq. 26."""
    n, everyone = len(g), list(range(len(g)))
    out = []
    for i in everyone:
        others = [j for j in everyone if j != i]
        if estimator == "s":
            out.append(paper_S(g, i, k, everyone))
        elif estimator == "sloo":
            out.append(paper_S(g, i, k, everyone) - sum(paper_S(g, j, k, others) for j in others) / (n - 1))
        elif k == 1:  # sloo_minus_one at k = 1: Eq. 26 (RLOO), at the paper's s_i = g_i / n scale
            out.append((g[i] - sum(g[j] for j in others) / (n - 1)) / n)
        else:
            mine = [s for s in itertools.combinations(everyone, k) if i in s]
            out.append(sum(max(g[j] for j in s) - max(g[j] for j in s if j != i) for s in mine) / math.comb(n, k))
    return out


# ----------------------------------------------------------------------------- Pass@k Training
def test_passk_hand_numbers():
    # N = 8, N_neg = 6, k = 4: R = 1 - C(6,4)/C(8,4) = 11/14, sigma = sqrt(33)/14,
    # A_pos = (3/14) / sigma = 3/sqrt(33), A_neg = (3/14 - C(5,3)/C(7,3)) / sigma = -1/sqrt(33).
    correct = torch.tensor([1, 0, 0, 1, 0, 0, 0, 0], dtype=torch.bool)
    adv = passk_advantages(correct, 8, 4, eps=0.0)
    want = torch.where(correct, torch.tensor(3 / math.sqrt(33)), torch.tensor(-1 / math.sqrt(33)))
    torch.testing.assert_close(adv, want)
    # Unscaled (scale_rewards: none): the numerators 3/14 and -1/14.
    torch.testing.assert_close(passk_advantages(correct, 8, 4, scale=False)[:2], torch.tensor([3 / 14, -1 / 14]))


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_passk_equals_subset_enumeration(k):
    gen = torch.Generator().manual_seed(k)
    correct = torch.rand(4 * 6, generator=gen) < 0.35
    adv = passk_advantages(correct, 6, k)
    want = [v for g in range(4) for v in brute_passk(correct[g * 6:(g + 1) * 6].tolist(), k)]
    torch.testing.assert_close(adv, torch.tensor(want, dtype=torch.float32), atol=1e-5, rtol=1e-5)


def test_passk_k1_is_grpo_on_binary_rewards_and_unscorable_rows_get_zero():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    # k = 1 without scaling: r - group mean, TRL's scale_rewards="none".
    grpo = r - r.view(2, 3).mean(1).repeat_interleave(3)
    torch.testing.assert_close(passk_advantages(r > 0, 3, 1, scale=False), grpo)
    valid = torch.tensor([True, True, False, True, True, True])
    adv = passk_advantages(torch.tensor([1, 0, 1, 1, 1, 0], dtype=torch.bool), 3, 2, valid=valid)
    assert adv[2] == 0  # left out of its group: the group is then {1 correct, 1 wrong} with k = 2 -> all pass
    assert adv[:2].abs().max() < 1e-3


# ----------------------------------------------------------------------------- PKPO
def test_pkpo_hand_numbers():
    g = torch.tensor([0.0, 1.0, 0.0, 1.0])  # n = 4, c = 2, k = 2
    # mean over the 3 pairs containing i of their max: correct 1, wrong 2/3.
    torch.testing.assert_close(pkpo_transform(g, 4, 2, "s"), torch.tensor([2 / 3, 1, 2 / 3, 1]))
    # max(S) - max(S minus i): a correct sample counts only in its 2 pairs with a wrong one.
    torch.testing.assert_close(pkpo_transform(g, 4, 2, "sloo_minus_one"), torch.tensor([0, 2 / 3, 0, 2 / 3]))
    # Eq. 29: minus n/(n-1) = 4/3 times pass@2 of the other three: 1 - 4/3 * 2/3 for a correct sample,
    # 2/3 - 4/3 * 1 for a wrong one.
    torch.testing.assert_close(pkpo_transform(g, 4, 2, "sloo"), torch.tensor([-2 / 3, 1 / 9, -2 / 3, 1 / 9]))
    # Continuous rewards (max@k): 0.1 and 0.3 each sit in {.., 0.7} and {0.1, 0.3}.
    torch.testing.assert_close(pkpo_transform(torch.tensor([0.1, 0.7, 0.3]), 3, 2, "s"), torch.tensor([0.5, 0.7, 0.5]))


@pytest.mark.parametrize("estimator", ["s", "sloo", "sloo_minus_one"])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_pkpo_equals_the_papers_definitions(estimator, k):
    """`pkpo_transform` is the paper's estimator times n/k (our scale), group by group."""
    gen = torch.Generator().manual_seed(10 * k)
    r = torch.rand(3 * 6, generator=gen).round(decimals=1)  # ties included
    t = pkpo_transform(r, 6, k, estimator)
    want = [6 / k * v for g in range(3) for v in brute_pkpo(r[g * 6:(g + 1) * 6].tolist(), k, estimator)]
    torch.testing.assert_close(t, torch.tensor(want, dtype=torch.float32), atol=1e-6, rtol=1e-6)


def test_pkpo_sloo_baseline_is_eq29s_and_not_centred():
    """Eq. 29's baseline sums S(j, k, others) over the n-1 others: k/(n-1) rho_k(others) at the paper's scale, so
    a group's transformed rewards sum to -n/(n-1) rho_k(g) at ours (the leave-one-out rho_k of all samples sum to
    n rho_k(g)). The minus-one variant sums to n (rho_k - rho_{k-1})."""
    g = [0.1, 0.9, 0.4, 0.4, 0.7]
    n, k = 5, 3
    rho = {kk: sum(max(s) for s in itertools.combinations(g, kk)) / math.comb(n, kk) for kk in (2, 3)}
    t = pkpo_transform(torch.tensor(g, dtype=torch.float64), n, k, "sloo").double()
    assert t.sum().item() == pytest.approx(-n / (n - 1) * rho[3], abs=1e-6)
    t1 = pkpo_transform(torch.tensor(g, dtype=torch.float64), n, k, "sloo_minus_one").double()
    assert t1.sum().item() == pytest.approx(n * (rho[3] - rho[2]), abs=1e-6)


def test_pkpo_unbiased_on_average_over_draws():
    """E[sum_i s_i] over draws of n samples equals k * pass@k of the Bernoulli(p) population (Eq. 19 summed)."""
    p, n, k, draws = 0.3, 6, 3, 4000
    gen = torch.Generator().manual_seed(0)
    r = (torch.rand(draws * n, generator=gen) < p).float()
    total = pkpo_transform(r, n, k, "s").view(draws, n).sum(1) * k / n  # back to the paper's s_i scale
    torch.testing.assert_close(total.mean(), torch.tensor(k * (1 - (1 - p) ** k)), atol=0.03, rtol=0)


# Hand-worked PKPO advantages, G = 4, k = 2 (each sample sits in 3 pairs). At our scale the transform of sample i is
# the mean over the pairs {i, j} of max(g_i, g_j) (Eq. 19 times n/k); the baselines are Eq. 29 (sloo: minus
# n/(n-1) = 4/3 times rho_2 of the other three, the mean of their 3 pairs' max) and Eq. 33 (sloo_minus_one: minus
# rho_1 of the other three, their mean). "s" is then centred and divided by the group's Bessel std as TRL does;
# the baselined ones are only divided by it (std + TRL's eps 1e-4), not re-centred.
#
# Binary g = [0, 1, 0, 1]:
#   s:              t = [2/3, 1, 2/3, 1], mean 5/6, deviations -+1/6, var = 4 (1/36) / 3 = 1/27, std = sqrt(3)/9
#   sloo_minus_one: wrong 2/3 - mean(0, 1, 1) = 0, right 1 - mean(0, 0, 1) = 2/3; t = [0, 2/3, 0, 2/3],
#                   mean 1/3, var = 4 (1/9) / 3 = 4/27, std = 2 sqrt(3)/9
#   sloo:           wrong 2/3 - 4/3 * 1 = -2/3, right 1 - 4/3 * 2/3 = 1/9; t = [-2/3, 1/9, -2/3, 1/9],
#                   mean -5/18, deviations -+7/18, var = 4 (49/324) / 3 = 49/243, std = 7 sqrt(3)/27
# Graded g = [0.5, 0, 1, 0.25] (pairs' max: 0.5 -> .5, 1, .5; 0 -> .5, 1, .25; 1 -> 1, 1, 1; 0.25 -> .5, .25, 1):
#   s:              t = [8, 7, 12, 7]/12, mean 17/24, deviations [-1, -3, 7, -3]/24, var = 68/576/3 = 17/432,
#                   std = sqrt(51)/36
#   sloo_minus_one: means of the others 5/12, 7/12, 3/12, 6/12; t = [3, 0, 9, 1]/12, mean 13/48,
#                   deviations [-1, -13, 23, -9]/48, var = 780/2304/3 = 65/576, std = sqrt(65)/24
#   sloo:           rho_2 of the others 3/4, 5/6, 5/12, 5/6, times 4/3: 1, 10/9, 5/9, 10/9;
#                   t = [2/3 - 1, 7/12 - 10/9, 1 - 5/9, 7/12 - 10/9] = [-12, -19, 16, -19]/36, mean -17/72,
#                   deviations [-7, -21, 49, -21]/72, var = 3332/5184/3 = 833/3888, std = 7 sqrt(51)/108
_R3, _R51, _R65 = math.sqrt(3), math.sqrt(51), math.sqrt(65)
PKPO_BINARY, PKPO_GRADED = [0.0, 1.0, 0.0, 1.0], [0.5, 0.0, 1.0, 0.25]
#: estimator: ((binary numerator, binary std), (graded numerator, graded std)), from the derivation above
PKPO_HAND = {
    "s": (([-1 / 6, 1 / 6, -1 / 6, 1 / 6], _R3 / 9), ([-1 / 24, -3 / 24, 7 / 24, -3 / 24], _R51 / 36)),
    "sloo_minus_one": (([0, 2 / 3, 0, 2 / 3], 2 * _R3 / 9), ([3 / 12, 0, 9 / 12, 1 / 12], _R65 / 24)),
    "sloo": (([-2 / 3, 1 / 9, -2 / 3, 1 / 9], 7 * _R3 / 27), ([-12 / 36, -19 / 36, 16 / 36, -19 / 36], 7 * _R51 / 108)),
}


@pytest.mark.parametrize("estimator", ["s", "sloo", "sloo_minus_one"])
def test_pkpo_advantages_hand_normalised(estimator):
    """pkpo_advantages = the transform (centred for "s"), divided by its group's std + 1e-4; values by hand."""
    (num_b, std_b), (num_g, std_g) = PKPO_HAND[estimator]
    want_b = torch.tensor([x / (std_b + 1e-4) for x in num_b])
    want_g = torch.tensor([x / (std_g + 1e-4) for x in num_g])
    torch.testing.assert_close(pkpo_advantages(torch.tensor(PKPO_BINARY), 4, 2, estimator), want_b,
                               atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(pkpo_advantages(torch.tensor(PKPO_GRADED), 4, 2, estimator), want_g,
                               atol=1e-6, rtol=1e-6)
    # One batch of both groups: each is divided by its own group's std.
    both = pkpo_advantages(torch.tensor(PKPO_BINARY + PKPO_GRADED), 4, 2, estimator)
    torch.testing.assert_close(both, torch.cat([want_b, want_g]), atol=1e-6, rtol=1e-6)
    # scale="none": the transform itself (centred for "s"), no division.
    torch.testing.assert_close(pkpo_advantages(torch.tensor(PKPO_GRADED), 4, 2, estimator, scale="none"),
                               torch.tensor(num_g), atol=1e-6, rtol=1e-6)


def test_pkpo_k1_s_is_grpo_bit_for_bit_and_nan_rows_zero():
    r = torch.tensor([0.1, 0.7, 0.3, 0.9, 0.5, 0.2, 0.2, 0.8])
    assert torch.equal(pkpo_advantages(r, 4, 1, "s"), group_advantages(r, 4))
    r[2] = float("nan")
    adv = pkpo_advantages(r, 4, 2)
    assert adv[2] == 0 and torch.isfinite(adv).all()


def test_pkpo_a_group_of_one_scored_reward_gets_0_and_the_others_keep_their_numbers():
    """Hand-worked: a group of one has no leave-one-out baseline and no std, so it gets 0 (was the reward / eps = reward
    x 1e4 at num_generations 1, and the raw reward at scale "none"); every other group-relative advantage of the
    package gives it 0 too. A group with one scored reward among NaNs is a group of one."""
    for scale in ("group", "batch", "none"):
        for estimator in ("sloo_minus_one", "sloo", "s"):
            assert pkpo_advantages(torch.tensor([0.7, 0.2, 1.0]), 1, 1, estimator, scale=scale).tolist() == [0, 0, 0]
        assert passk_advantages(torch.tensor([True, False]), 1, 1).tolist() == [0, 0]
    # g = [0.5, 0, 1, 0.25], k = 2, sloo_minus_one, unscaled: PKPO_HAND's graded group (worked out above),
    # [3, 0, 9, 1]/12; beside it a group whose only scored reward is 0.9
    hand = PKPO_HAND["sloo_minus_one"][1][0]
    nan = float("nan")
    r = torch.tensor([0.5, 0.0, 1.0, 0.25, nan, 0.9, nan, nan])  # the second group: one scored reward
    for scale in ("none", "group", "batch"):
        adv = pkpo_advantages(r, 4, 2, "sloo_minus_one", scale=scale)
        assert adv[4:].tolist() == [0, 0, 0, 0], scale
    assert pkpo_advantages(r, 4, 2, "sloo_minus_one", scale="none")[:4].tolist() == pytest.approx(hand, abs=1e-7)
    t = pkpo_transform(r, 4, 2, "sloo_minus_one")  # the transform itself: one scored reward has no baseline
    assert t[5].item() == pytest.approx(0.9) and torch.isnan(t[[4, 6, 7]]).all()


def test_passk_and_pkpo_on_groups_of_unequal_scored_counts_match_each_group_alone():
    """The vectorised functions (no loop over groups) give each group what it gets alone, whatever the number of
    scored rows of each group in the batch, and that is the brute-force enumeration on the group's scored rows (k
    capped at their count n, at n - 1 for sloo; one scored reward has no baseline)."""
    g = torch.Generator().manual_seed(3)
    groups, size = [], 6
    for n_scored in (6, 5, 3, 2, 1, 4):
        r = (torch.rand(size, generator=g) * 4).floor() / 3
        r[n_scored:] = float("nan")
        groups.append(r[torch.randperm(size, generator=g)])
    batch = torch.cat(groups)
    for k in (1, 2, 3, 6):
        for estimator in ("sloo_minus_one", "sloo", "s"):
            together = pkpo_transform(batch, size, k, estimator)
            alone = torch.cat([pkpo_transform(r, size, k, estimator) for r in groups])
            torch.testing.assert_close(together, alone, equal_nan=True)
            for i, r in enumerate(groups):
                scored = ~torch.isnan(r)
                n = int(scored.sum())
                kk, est = min(k, n), ("s" if n == 1 else estimator)
                kk = min(kk, n - 1) if est == "sloo" else kk
                want = [n / kk * v for v in brute_pkpo(r[scored].tolist(), kk, est)]
                got = together[i * size:(i + 1) * size]
                torch.testing.assert_close(got[scored], torch.tensor(want, dtype=torch.float32), atol=1e-6, rtol=1e-6)
                assert torch.isnan(got[~scored]).all()
        valid = ~torch.isnan(batch)
        together = passk_advantages(batch > 0.5, size, k, valid=valid)
        alone = torch.cat([passk_advantages(r > 0.5, size, k, valid=~torch.isnan(r)) for r in groups])
        assert torch.equal(together, alone)
        for i, r in enumerate(groups):
            scored = ~torch.isnan(r)
            want = brute_passk((r[scored] > 0.5).tolist(), min(k, int(scored.sum())))
            got = together[i * size:(i + 1) * size]
            torch.testing.assert_close(got[scored], torch.tensor(want, dtype=torch.float32), atol=1e-5, rtol=1e-5)
            assert (got[~scored] == 0).all()


def test_pkpo_k_schedule():
    assert [pkpo_k_at_step(s, 8, 1, 10, "step") for s in (0, 9, 10, 50)] == [8, 8, 1, 1]
    assert [pkpo_k_at_step(s, 8, 1, 14, "linear") for s in (0, 7, 14, 20)] == [8, 4, 1, 1]  # 8 - 7 * 0.5 = 4.5 -> 4
    assert pkpo_k_at_step(100, 8, None, 10, "step") == 8
    assert pkpo_k_at_step(100, 8, 1, 10, "constant") == 8


# ----------------------------------------------------------------------------- unlikeliness reward
def brute_unlikely(rewards, scores, beta, rank_among_correct=False):
    idx = [i for i in range(len(rewards)) if rewards[i] > 0] if rank_among_correct else list(range(len(rewards)))
    ordered = sorted(idx, key=lambda i: (scores[i], i))  # ascending likelihood, ties by row
    out = list(rewards)
    for rank, i in enumerate(ordered):
        out[i] = rewards[i] * (1 - beta * rank / len(idx))
    return out


def test_unlikeliness_hand_numbers():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0])
    logps = torch.tensor([[-1.0, -1.0], [-3.0, -3.0], [-2.0, 0.0], [-0.5, 9.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 0]])
    # mean log-probs -1, -3, -2, -0.5 -> ascending ranks 2, 0, 1, 3 of G = 4
    out = unlikeliness_rewards(r, logps, mask, 4, beta=0.25)
    torch.testing.assert_close(out, torch.tensor([1 - 0.25 * 2 / 4, 1.0, 0.0, 1 - 0.25 * 3 / 4]))
    # Ranked among the 3 correct only: ranks 1, 0, -, 2 of 3.
    out = unlikeliness_rewards(r, logps, mask, 4, beta=0.25, correct=r > 0, rank_among="correct")
    torch.testing.assert_close(out, torch.tensor([1 - 0.25 / 3, 1.0, 0.0, 1 - 0.25 * 2 / 3]))
    # 'sum': -2, -6, -2, -0.5 -> rows 0 and 2 tie; the earlier row ranks first: ranks 1, 0, 2, 3.
    out = unlikeliness_rewards(r, logps, mask, 4, beta=0.25, logp="sum")
    torch.testing.assert_close(out, torch.tensor([1 - 0.25 / 4, 1.0, 0.0, 1 - 0.25 * 3 / 4]))
    assert torch.equal(unlikeliness_rewards(r, logps, mask, 4, beta=0.0), r)


@pytest.mark.parametrize("among", ["group", "correct"])
def test_unlikeliness_equals_sorting(among):
    gen = torch.Generator().manual_seed(3)
    r = (torch.rand(24, generator=gen) < 0.5).float()
    logps, mask = -torch.rand(24, 5, generator=gen), torch.ones(24, 5)
    out = unlikeliness_rewards(r, logps, mask, 6, beta=0.4, correct=r > 0, rank_among=among)
    scores = logps.mean(1).tolist()
    want = [v for g in range(4) for v in brute_unlikely(r[g * 6:(g + 1) * 6].tolist(), scores[g * 6:(g + 1) * 6],
                                                         0.4, among == "correct")]
    torch.testing.assert_close(out, torch.tensor(want))


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize("kwargs, text", [
    (dict(method="passk", passk_k=5), "passk_k is 5 but num_generations is 4"),
    (dict(method="pkpo", pkpo_k=0), "pkpo_k is 0 but must be an integer >= 1"),
    (dict(method="pkpo", pkpo_estimator="loo"), "pkpo_estimator must be one of"),
    (dict(method="pkpo", pkpo_k=4, pkpo_estimator="sloo"), "pkpo_estimator 'sloo' needs pkpo_k < num_generations"),
    (dict(method="unlikely", unlikely_beta=1.5), "unlikely_beta is 1.5 but must be <= 1"),
    (dict(method="unlikely", unlikely_logp="max"), "unlikely_logp must be one of"),
])
def test_config_errors_name_the_key(kwargs, text, tmp_path):
    cls = et.get_config_class(kwargs.pop("method"))
    with pytest.raises(ValueError, match=text):
        cls(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=4, report_to=[], **kwargs)


# ----------------------------------------------------------------------------- trainers
def split_reward(completions, **kwargs):
    """Graded and mixed: 'correct' (> 0.3) for completions with at least 3 distinct characters."""
    return [len(set(c)) / 8 for c in completions]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


METRICS = {"passk": ["passk/k", "passk/adv_correct_mean", "passk/adv_wrong_mean"],
           "pkpo": ["pkpo/k", "pkpo/adv_abs_mean"],
           "unlikely": ["unlikely/factor_correct_mean", "unlikely/adv_change_abs_mean"],
           "casp": ["casp/forking_frac"], "kl_cov": ["kl_cov/selected_tokens"]}
ACTIVE = {"passk": dict(passk_k=2), "pkpo": dict(pkpo_k=3), "unlikely": dict(unlikely_beta=1.0)}


@pytest.fixture(scope="module")
def grpo_run(ckpt, tmp_path_factory):
    cls = et.get_trainer_class("grpo")
    return train(cls, cls.config_class, ckpt, tmp_path_factory.mktemp("grpo"), reward=split_reward,
                 correct_reward_threshold=0.3)


@pytest.mark.parametrize("method", ["passk", "pkpo", "unlikely", "passk+casp", "pkpo+kl_cov"])
def test_trainer_acts_logs_and_composes(method, ckpt, grpo_run, tmp_path):
    cls = et.get_trainer_class(method)
    extra = {k: v for part in method.split("+") for k, v in ACTIVE.get(part, {}).items()}
    if "casp" in method:
        extra.update(casp_alpha=0.5, casp_entropy_quantile=0.0)
    if "kl_cov" in method:
        extra.update(kl_cov_ratio=0.5)
    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=split_reward, correct_reward_threshold=0.3, **extra)
    logged = {k for entry in trainer.state.log_history for k in entry}
    for part in method.split("+"):
        assert set(METRICS[part]) <= logged, (part, sorted(logged))
    assert max_param_diff(grpo_run, trainer) > 1e-5
    if method == "pkpo":
        assert [e["pkpo/k"] for e in trainer.state.log_history if "pkpo/k" in e][0] == 3


def test_pkpo_k_annealing_is_logged(ckpt, tmp_path):
    cls = et.get_trainer_class("pkpo")
    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=split_reward, pkpo_k=4, pkpo_k_final=1,
                    pkpo_k_anneal_steps=2, max_steps=3)
    assert [e["pkpo/k"] for e in trainer.state.log_history if "pkpo/k" in e] == [4, 4, 1]


def test_passk_k1_unscaled_equals_trl_on_binary_rewards(ckpt, tmp_path):
    """Pass@k Training's neutral point: k = 1 is GRPO's objective; with binary rewards and scale_rewards 'none'
    (the analytic std is the population std, TRL's the sample std) it trains exactly as TRL's GRPOTrainer."""
    ref = train(GRPOTrainer, GRPOConfig, ckpt, tmp_path / "trl", reward=binary_reward, scale_rewards="none")
    assert params_changed(ref, ckpt) > 1e-3
    cls = et.get_trainer_class("passk")
    ours = train(cls, cls.config_class, ckpt, tmp_path / "passk", reward=binary_reward, scale_rewards="none",
                 passk_k=1, correct_reward_threshold=0.5)
    assert max_param_diff(ref, ours) <= 1e-6

"""Hand-worked tests for exploration_trl.core.advantages (the arithmetic is in the comments)."""

import math

import pytest
import torch
from torch.testing import assert_close

from exploration_trl.core import (
    confidence,
    dsgrpo_advantages,
    group_advantages,
    position_bonus_advantages,
    ppl_shaped_advantages,
    progrpo_advantages,
)

T = torch.tensor
F32 = torch.float32


def lg(*probs):
    """log of a list of probabilities (float32 row)."""
    return torch.log(T(probs, dtype=F32))


# ----------------------------------------------------------------------------------------------
# group_advantages
# ----------------------------------------------------------------------------------------------


def test_group_advantages_hand_worked_group_scale():
    # group 1: r = [1, 0, 0], mean 1/3, deviations [2/3, -1/3, -1/3]
    #   unbiased var = (4/9 + 1/9 + 1/9) / 2 = 1/3, std = 0.5773503
    #   A = [0.6666667, -0.3333333, -0.3333333] / 0.5774503 = [1.1545006, -0.5772503, -0.5772503]
    # group 2: r = [1, 2, 3], mean 2, std 1 -> A = [-1, 0, 1] / 1.0001 = [-0.9999, 0, 0.9999]
    r = T([1.0, 0.0, 0.0, 1.0, 2.0, 3.0])
    out = group_advantages(r, 3)
    assert out.dtype == F32 and out.shape == (6,)
    assert_close(out, T([1.1545006, -0.5772503, -0.5772503, -0.99990001, 0.0, 0.99990001]))


def test_group_advantages_uniform_group_is_zero():
    # all-equal rewards: r - mean = 0, std = 0 -> 0 / (0 + 1e-4) = 0 (no NaN)
    out = group_advantages(T([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), 3)
    assert_close(out, torch.zeros(6))


def test_group_advantages_non_binary_rewards():
    # r = [0.2, 0.5, 0.8], mean 0.5, unbiased var = (0.09 + 0 + 0.09) / 2 = 0.09, std 0.3
    # A = [-0.3, 0, 0.3] / 0.3001 = [-0.9996668, 0, 0.9996668]
    out = group_advantages(T([0.2, 0.5, 0.8]), 3)
    assert_close(out, T([-0.9996668, 0.0, 0.9996668]))


def test_group_advantages_batch_scale():
    # groups [0, 1], [0, 1]: group means 0.5 -> deviations [-0.5, 0.5, -0.5, 0.5]
    # batch std of [0,1,0,1]: mean 0.5, sum of squares 1, / 3 -> var 1/3, std 0.5773503
    # A = +-0.5 / 0.5774503 = +-0.8658754
    out = group_advantages(T([0.0, 1.0, 0.0, 1.0]), 2, scale="batch")
    assert_close(out, T([-0.8658754, 0.8658754, -0.8658754, 0.8658754]))


def test_group_advantages_none_scale_only_centres():
    # group means 2 and 3 -> [3-2, 1-2, 4-3, 2-3] = [1, -1, 1, -1]
    out = group_advantages(T([3.0, 1.0, 4.0, 2.0]), 2, scale="none")
    assert_close(out, T([1.0, -1.0, 1.0, -1.0]))


def test_group_advantages_nan_rewards_like_trl():
    # group 1: [1, nan] -> one finite value, nanstd is NaN -> advantage NaN -> 0 (as TRL); NaN row -> 0
    # group 2: [0, 1], mean 0.5, std sqrt(0.5) = 0.7071068 -> +-0.5 / 0.7072068 = +-0.7070068
    out = group_advantages(T([1.0, float("nan"), 0.0, 1.0]), 2)
    assert_close(out, T([0.0, 0.0, -0.7070068, 0.7070068]))
    # group [nan, 1, 3]: mean 2 over the finite ones, std sqrt(2) -> [0, -1, 1] / 1.4143136
    out = group_advantages(T([float("nan"), 1.0, 3.0]), 3)
    assert_close(out, T([0.0, -0.7070568, 0.7070568]))


def test_group_advantages_single_generation_is_zero():
    # G = 1: std is defined as 0 (TRL eval path) and r - mean = 0
    assert_close(group_advantages(T([0.3, 5.0]), 1), torch.zeros(2))
    assert_close(group_advantages(T([0.3]), 1, scale="batch"), torch.zeros(1))


def test_group_advantages_bf16_and_column_input():
    # bf16 rewards give float32 results equal to the float32 computation of the same values
    r = T([1.0, 0.0, 0.0, 1.0, 2.0, 3.0])
    out = group_advantages(r.to(torch.bfloat16), 3)
    assert out.dtype == F32
    assert_close(out, group_advantages(r, 3))
    # (B, 1) rewards are accepted and give (B,)
    assert_close(group_advantages(r.unsqueeze(-1), 3), group_advantages(r, 3))


def test_group_advantages_does_not_modify_input_and_validates():
    r = T([1.0, float("nan"), 0.0, 1.0])
    before = r.clone()
    group_advantages(r, 2)
    assert_close(r, before, equal_nan=True)
    with pytest.raises(ValueError):
        group_advantages(T([1.0, 2.0, 3.0]), 2)
    with pytest.raises(ValueError):
        group_advantages(T([1.0, 2.0]), 2, scale="bogus")


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_matches_trl_formula(scale):
    # TRL 1.16 GRPOTrainer, multi_objective_aggregation="sum_then_normalize"
    from trl.trainer.utils import nanstd

    g = torch.Generator().manual_seed(0)
    G = 4
    rewards = torch.randn(24, generator=g)
    rewards[::5] = torch.round(rewards[::5])  # some ties
    rewards[4:8] = 1.0  # a uniform group
    rewards[13] = float("nan")  # an unscorable completion
    mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G)
    if scale in ("group", "none"):
        std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G)
    else:
        std = nanstd(rewards).expand_as(rewards)
    ref = rewards - mean
    if scale != "none":
        ref = ref / (std + 1e-4)
    ref = torch.nan_to_num(ref, nan=0.0)
    assert_close(group_advantages(rewards, G, scale=scale), ref)


# ----------------------------------------------------------------------------------------------
# confidence
# ----------------------------------------------------------------------------------------------


def test_confidence_bottom_fraction():
    # row 0: 10 valid tokens, k = ceil(0.2 * 10) = 2 lowest probs 0.05, 0.1 -> sqrt(0.05 * 0.1) = 0.0707107
    # row 1: 3 valid tokens [0.5, 0.2, 0.9], k = ceil(0.6) = 1 -> 0.2 (padding ignored even if lower)
    # row 2: 6 valid tokens, k = ceil(1.2) = 2 -> lowest 0.3, 0.6 -> sqrt(0.18) = 0.4242641
    logps = torch.stack(
        [
            lg(0.9, 0.8, 0.05, 0.7, 0.6, 0.1, 0.95, 0.99, 0.5, 0.4),
            lg(0.5, 0.2, 0.9, 1e-9, 1e-9, 1e-9, 1e-9, 1e-9, 1e-9, 1e-9),
            lg(0.9, 0.6, 0.7, 0.3, 0.8, 0.95, 1e-9, 1e-9, 1e-9, 1e-9),
        ]
    )
    mask = torch.zeros(3, 10, dtype=torch.long)
    mask[0] = 1
    mask[1, :3] = 1
    mask[2, :6] = 1
    out = confidence(logps, mask)
    assert out.dtype == F32 and out.shape == (3,)
    assert_close(out, T([0.0707107, 0.2, 0.4242641]))


def test_confidence_one_token_and_empty_rows():
    # one-token row: k = max(1, ceil(0.2)) = 1 -> its own probability 0.3
    # empty row: NaN; padding may hold -inf and must not leak
    logps = torch.stack([lg(0.3, 0.1), T([-float("inf"), -float("inf")])])
    mask = T([[1, 0], [0, 0]])
    out = confidence(logps, mask)
    assert_close(out[0], T(0.3))
    assert torch.isnan(out[1])


def test_confidence_fraction_edge_cases():
    # 35 tokens with logps -0.1 .. -3.5, fraction 0.2 -> k = 7 lowest: -2.9 .. -3.5, mean -3.2
    # -> exp(-3.2) = 0.0407622
    logps = -torch.arange(1, 36, dtype=F32).unsqueeze(0) / 10
    mask = torch.ones(1, 35)
    assert_close(confidence(logps, mask), T([0.0407622]))
    # fraction 0.28 of 25 tokens is 7 tokens (0.28 * 25 = 7.000000000000001 in floating point must
    # not round up to 8): logps -0.1..-2.5, 7 lowest: -1.9..-2.5, mean -2.2 -> exp(-2.2) = 0.1108032
    # (k = 8 would give exp(-2.15) = 0.1164842)
    logps = -torch.arange(1, 26, dtype=F32).unsqueeze(0) / 10
    assert_close(confidence(logps, torch.ones(1, 25), 0.28), T([0.1108032]))
    # fraction 0.7 of 10 tokens: logps -1..-10, 7 lowest: -4..-10, mean -7 -> exp(-7) = 9.118820e-4
    logps = -torch.arange(1, 11, dtype=F32).unsqueeze(0)
    assert_close(confidence(logps, torch.ones(1, 10), 0.7), T([math.exp(-7.0)]), atol=1e-7, rtol=1e-5)
    # fraction 1.0: geometric mean of all tokens, exp(-5.5)
    assert_close(confidence(logps, torch.ones(1, 10), 1.0), T([math.exp(-5.5)]), atol=1e-7, rtol=1e-5)


def test_confidence_bf16():
    # bf16 log(0.5) = -0.6931 rounds to -0.69140625; one token row -> exp(-0.69140625) = 0.5008712
    logps = T([[-0.6931472, -5.0]], dtype=torch.bfloat16)
    out = confidence(logps, T([[1, 0]]))
    assert out.dtype == F32
    assert_close(out, T([0.5008712]))


# ----------------------------------------------------------------------------------------------
# progrpo_advantages
# ----------------------------------------------------------------------------------------------


def _progrpo_inputs():
    # B = 4, G = 2. Group 1 rewards [1, 0] (mixed), group 2 rewards [1, 1] (uniform).
    # completion confidences (fraction 0.2):
    #   row 0: one token p = 0.5              -> c_o = 0.5
    #   row 1: 5 tokens, lowest p = 0.2 (k=1)  -> c_o = 0.2
    #   row 2: 2 tokens, lowest p = 0.6 (k=1)  -> c_o = 0.6
    #   row 3: 2 tokens, lowest 0.7            -> c_o = 0.7
    # prompt confidences: every prompt row has its lowest valid prob 0.4 (k=1) -> c_ref = 0.4
    comp = torch.stack(
        [
            lg(0.5, 1e-9, 1e-9, 1e-9, 1e-9),
            lg(0.9, 0.2, 0.8, 0.9, 0.9),
            lg(0.6, 0.8, 1e-9, 1e-9, 1e-9),
            lg(0.7, 0.9, 1e-9, 1e-9, 1e-9),
        ]
    )
    cmask = T([[1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 0, 0, 0]])
    # prompts are left-padded; first prompt token masked out by the caller
    prompt = torch.stack([lg(1e-9, 0.3, 0.4, 0.9)] * 4)
    pmask = T([[0, 0, 1, 1]] * 4)
    rewards = T([1.0, 0.0, 1.0, 1.0])
    adv = T([1.0, -1.0, 0.5, -0.5])
    return adv, rewards, comp, cmask, prompt, pmask


def test_progrpo_prompt_baseline():
    adv, rewards, comp, cmask, prompt, pmask = _progrpo_inputs()
    out = progrpo_advantages(adv, rewards, 2, comp, cmask, prompt, pmask)
    # row 0: 1 + 0.3 * (0.4 - 0.5) = 0.97 ; row 1: -1 + 0.3 * (0.4 - 0.2) = -0.94
    # group 2 is uniform (all correct): keeps [0.5, -0.5]
    assert out.dtype == F32 and out.shape == (4,)
    assert_close(out, T([0.97, -0.94, 0.5, -0.5]))


def test_progrpo_group_mean_baseline():
    adv, rewards, comp, cmask, prompt, pmask = _progrpo_inputs()
    out = progrpo_advantages(adv, rewards, 2, comp, cmask, None, None, baseline="group_mean")
    # group 1: c_ref = (0.5 + 0.2) / 2 = 0.35
    # row 0: 1 + 0.3 * (0.35 - 0.5) = 0.955 ; row 1: -1 + 0.3 * (0.35 - 0.2) = -0.955
    assert_close(out, T([0.955, -0.955, 0.5, -0.5]))


def test_progrpo_skip_groups_all_wrong():
    """Eq. 4 as printed: only all-wrong groups keep A; an all-right group gets alpha * (c_ref - c_o)."""
    adv, rewards, comp, cmask, prompt, pmask = _progrpo_inputs()
    out = progrpo_advantages(adv, rewards, 2, comp, cmask, prompt, pmask, skip_groups="all_wrong")
    # group 1 (mixed) as before: [0.97, -0.94]
    # group 2 (all right) is now shaped: 0.5 + 0.3 * (0.4 - 0.6) = 0.44 ; -0.5 + 0.3 * (0.4 - 0.7) = -0.59
    assert_close(out, T([0.97, -0.94, 0.44, -0.59]))
    # an all-wrong group keeps A under both rules
    wrong = T([1.0, 0.0, 0.0, 0.0])
    for rule in ("all_equal", "all_wrong"):
        out = progrpo_advantages(adv, wrong, 2, comp, cmask, prompt, pmask, skip_groups=rule)
        assert_close(out[2:], T([0.5, -0.5]))
    # "correct" is reward > correct_threshold: with threshold 1 no reward counts as correct, every group keeps A
    out = progrpo_advantages(adv, rewards, 2, comp, cmask, prompt, pmask, skip_groups="all_wrong",
                             correct_threshold=1.0)
    assert_close(out, T([1.0, -1.0, 0.5, -0.5]))
    with pytest.raises(ValueError, match="skip_groups must be one of all_equal, all_wrong; got 'none'"):
        progrpo_advantages(adv, rewards, 2, comp, cmask, prompt, pmask, skip_groups="none")


def test_progrpo_sign_flip_and_keep_sign():
    """G = 2 with small GRPO advantages: the shift flips signs; keep_sign clamps correct >= 0, wrong <= 0."""
    _, rewards, comp, cmask, prompt, pmask = _progrpo_inputs()
    adv = T([0.02, -0.02, 0.0, 0.0])
    # alpha = 1: row 0 (correct): 0.02 + (0.4 - 0.5) = -0.08 (flipped) ; row 1 (wrong): -0.02 + (0.4 - 0.2) = 0.18
    out = progrpo_advantages(adv, rewards, 2, comp, cmask, prompt, pmask, alpha=1.0)
    assert_close(out, T([-0.08, 0.18, 0.0, 0.0]))
    out = progrpo_advantages(adv, rewards, 2, comp, cmask, prompt, pmask, alpha=1.0, keep_sign=True)
    assert_close(out, T([0.0, 0.0, 0.0, 0.0]))
    # rows whose sign did not flip are untouched by keep_sign (alpha 0.3: 0.02 - 0.03 = -0.01 flips, row 1 too)
    out = progrpo_advantages(T([1.0, -1.0, 0.5, -0.5]), rewards, 2, comp, cmask, prompt, pmask, keep_sign=True)
    assert_close(out, T([0.97, -0.94, 0.5, -0.5]))


def test_progrpo_non_binary_rewards_and_alpha():
    adv, _, comp, cmask, prompt, pmask = _progrpo_inputs()
    # threshold 0.4: group 1 [0.5 right, 0.25 wrong] and group 2 [0.3 wrong, 0.7 right] are mixed -> shaped (alpha 1)
    # row 2: 0.5 + (0.4 - 0.6) = 0.3 ; row 3: -0.5 + (0.4 - 0.7) = -0.8
    # group 1: row 0: 1 + (0.4 - 0.5) = 0.9 ; row 1: -1 + (0.4 - 0.2) = -0.8
    rewards = T([0.5, 0.25, 0.3, 0.7])
    out = progrpo_advantages(adv, rewards, 2, comp, cmask, prompt, pmask, alpha=1.0, correct_threshold=0.4)
    assert_close(out, T([0.9, -0.8, 0.3, -0.8]))
    # threshold 0: every reward counts as correct, both groups are all-right -> untouched, unequal rewards or not
    out = progrpo_advantages(adv, rewards, 2, comp, cmask, prompt, pmask, alpha=1.0)
    assert_close(out, adv)


def _graded_group_inputs():
    """G = 4, one prompt whose lowest prompt-token prob is 0.9 (c_ref = 0.9); completion confidences
    c_o = [0.5, 0.6, 0.5, 0.6] (one token each), so alpha 0.3 shifts rows by 0.3 * 0.4 = 0.12 and 0.3 * 0.3 = 0.09."""
    comp = torch.stack([lg(c, 1e-9) for c in (0.5, 0.6, 0.5, 0.6)])
    cmask = T([[1, 0]] * 4)
    prompt = torch.stack([lg(1e-9, 0.9)] * 4)
    pmask = T([[0, 1]] * 4)
    return comp, cmask, prompt, pmask


def test_progrpo_skip_rule_judges_correctness_under_a_graded_reward():
    """The recipes' reward is accuracy + 0.1 format (threshold 0.5): skipping is by correctness, not equal rewards."""
    comp, cmask, prompt, pmask = _graded_group_inputs()
    # all wrong, two of four formatted: rewards [0.1, 0, 0.1, 0], mean 0.05, deviations +-0.05, squares 4 * 0.0025
    # = 0.01, unbiased variance 0.01 / 3, std sqrt(0.01 / 3) = 0.1 / sqrt(3) = 0.05773502692;
    # GRPO A = +-0.05 / (0.05773502692 + 1e-4) = +-0.05 / 0.05783502692 = +-0.86452800 (0.8645279974)
    rewards = T([0.1, 0.0, 0.1, 0.0])
    adv = group_advantages(rewards, 4)
    assert_close(adv, T([0.8645280, -0.8645280, 0.8645280, -0.8645280]), atol=1e-6, rtol=0)
    for rule in ("all_equal", "all_wrong"):
        out = progrpo_advantages(adv, rewards, 4, comp, cmask, prompt, pmask, skip_groups=rule, correct_threshold=0.5)
        assert_close(out, adv)  # Algorithm 1 / Eq. 4: an all-wrong group is untouched
    # a threshold of 0 counts the format bonus as correct: the group looks mixed and is shifted
    # 0.8645280 + 0.12 = 0.9845280 ; -0.8645280 + 0.09 = -0.7745280
    out = progrpo_advantages(adv, rewards, 4, comp, cmask, prompt, pmask, correct_threshold=0.0)
    assert_close(out, T([0.9845280, -0.7745280, 0.9845280, -0.7745280]), atol=1e-6, rtol=0)
    # all right with mixed formatting [1.1, 1.0, 1.1, 1.0]: untouched under all_equal (Algorithm 1) ...
    rewards = T([1.1, 1.0, 1.1, 1.0])
    adv = group_advantages(rewards, 4)
    out = progrpo_advantages(adv, rewards, 4, comp, cmask, prompt, pmask, correct_threshold=0.5)
    assert_close(out, adv)
    # ... and shifted under all_wrong (Eq. 4 skips only all-wrong groups): A + [0.12, 0.09, 0.12, 0.09]
    out = progrpo_advantages(adv, rewards, 4, comp, cmask, prompt, pmask, skip_groups="all_wrong",
                             correct_threshold=0.5)
    assert_close(out, adv + T([0.12, 0.09, 0.12, 0.09]))
    # a mixed group [1.1, 0.1, 1.0, 0] is shifted under both rules
    rewards = T([1.1, 0.1, 1.0, 0.0])
    adv = group_advantages(rewards, 4)
    for rule in ("all_equal", "all_wrong"):
        out = progrpo_advantages(adv, rewards, 4, comp, cmask, prompt, pmask, skip_groups=rule, correct_threshold=0.5)
        assert_close(out, adv + T([0.12, 0.09, 0.12, 0.09]))
    # NaN rewards are ignored when judging: [NaN, 0.1, 0, 0.1] is all wrong -> untouched
    rewards = T([float("nan"), 0.1, 0.0, 0.1])
    out = progrpo_advantages(T([0.0, 1.0, -1.0, 1.0]), rewards, 4, comp, cmask, prompt, pmask, correct_threshold=0.5)
    assert_close(out, T([0.0, 1.0, -1.0, 1.0]))


def test_progrpo_nan_confidence_keeps_advantage():
    adv, rewards, comp, cmask, prompt, pmask = _progrpo_inputs()
    cmask = cmask.clone()
    cmask[0] = 0  # row 0 empty completion -> c_o NaN -> keeps A = 1
    pmask = pmask.clone()
    pmask[1] = 0  # row 1 empty prompt -> c_ref NaN -> keeps A = -1
    out = progrpo_advantages(adv, rewards, 2, comp, cmask, prompt, pmask)
    assert_close(out, T([1.0, -1.0, 0.5, -0.5]))
    # group_mean with row 0 empty: c_ref = nanmean([NaN, 0.2]) = 0.2 -> row 1: -1 + 0.3 * 0 = -1
    out = progrpo_advantages(adv, rewards, 2, comp, cmask, None, None, baseline="group_mean")
    assert_close(out, T([1.0, -1.0, 0.5, -0.5]))


def test_progrpo_advantage_shapes_and_bf16():
    adv, rewards, comp, cmask, prompt, pmask = _progrpo_inputs()
    expected = T([0.97, -0.94, 0.5, -0.5])
    # (B, 1) -> (B,)
    out = progrpo_advantages(adv.unsqueeze(-1), rewards, 2, comp, cmask, prompt, pmask)
    assert out.shape == (4,)
    assert_close(out, expected)
    # (B, T) per-token advantages -> (B, T), the row shift added to every column
    adv_t = adv.unsqueeze(-1).repeat(1, 3) * T([1.0, 2.0, 0.0])
    out = progrpo_advantages(adv_t, rewards, 2, comp, cmask, prompt, pmask)
    shift = T([-0.03, 0.06, 0.0, 0.0]).unsqueeze(-1)  # 0.3 * (c_ref - c_o), 0 for the uniform group
    assert out.shape == (4, 3)
    assert_close(out, adv_t + shift)
    # bf16 inputs: float32 output; bf16 log-probs move the confidences slightly
    out = progrpo_advantages(
        adv.bfloat16(), rewards.bfloat16(), 2, comp.bfloat16(), cmask, prompt.bfloat16(), pmask
    )
    assert out.dtype == F32
    assert_close(out, expected, atol=5e-3, rtol=0)


def test_progrpo_nan_reward_row_keeps_advantage_and_inputs_untouched():
    adv, rewards, comp, cmask, prompt, pmask = _progrpo_inputs()
    rewards = T([1.0, float("nan"), 1.0, 1.0])
    # group 1: finite rewards [1] only -> counts as uniform -> keeps; the NaN row keeps A anyway
    copies = [x.clone() for x in (adv, rewards, comp, cmask, prompt, pmask)]
    out = progrpo_advantages(adv, rewards, 2, comp, cmask, prompt, pmask)
    assert_close(out, adv)
    for x, c in zip((adv, rewards, comp, cmask, prompt, pmask), copies):
        assert_close(x, c, equal_nan=True)
    with pytest.raises(ValueError):
        progrpo_advantages(adv, rewards, 2, comp, cmask, None, None, baseline="prompt")


# ----------------------------------------------------------------------------------------------
# dsgrpo_advantages
# ----------------------------------------------------------------------------------------------


def _ds_inputs():
    # lbar (length-averaged logp, rollout policy):
    #   row 0: [-1, -2, -3] -> -2 ; row 1: one token -0.5 -> -0.5
    #   row 2: empty -> 0 / max(0, 1) = 0 ; row 3: [-4, -2, 0, -2] -> -2
    logps = T([[-1.0, -2.0, -3.0, 7.0], [-0.5, 9.0, 9.0, 9.0], [5.0, 5.0, 5.0, 5.0], [-4.0, -2.0, 0.0, -2.0]])
    mask = T([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    rewards = T([1.0, 0.0, 1.0, 0.5])  # non-binary: 0.5 > 0 counts as correct
    adv = T([0.5, -0.5, 1.0, 0.0])
    return adv, rewards, logps, mask


def _seq_mean(*args, **kwargs):
    return dsgrpo_advantages(*args, granularity="sequence_mean", **kwargs)


def _token(*args, **kwargs):
    return dsgrpo_advantages(*args, granularity="token", **kwargs)


def test_dsgrpo_token_granularity_hand_worked():
    """token: A_t = A - gamma_p * logp_t (correct) / A + gamma_n * logp_t (wrong), 0 on padding."""
    adv, rewards, logps, mask = _ds_inputs()
    out = _token(adv, rewards, logps, mask)
    # row 0 correct:   0.5 - 0.01 * [-1, -2, -3]        = [0.51, 0.52, 0.53], padding 0
    # row 1 incorrect: -0.5 + 0.01 * -0.5               = -0.505, padding 0
    # row 2 correct, no valid token                     -> all padding: 0
    # row 3 correct:   0 - 0.01 * [-4, -2, 0, -2]       = [0.04, 0.02, 0.0, 0.02]
    assert out.dtype == F32 and out.shape == (4, 4)
    assert_close(out, T([[0.51, 0.52, 0.53, 0.0], [-0.505, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0],
                         [0.04, 0.02, 0.0, 0.02]]))
    # gamma_p = 0 (DS-GRPO-Negative): correct rows keep A on valid tokens
    out = _token(adv, rewards, logps, mask, gamma_p=0.0, gamma_n=0.1)
    assert_close(out[0], T([0.5, 0.5, 0.5, 0.0]))
    assert_close(out[1], T([-0.55, 0.0, 0.0, 0.0]))
    # per-token input advantages are shifted token by token
    adv_t = T([[1.0, 2.0, 3.0, 4.0]] * 4)
    out = _token(adv_t, rewards, logps, mask)
    assert_close(out[0], T([1.01, 2.02, 3.03, 0.0]))
    # NaN reward keeps A on valid tokens; bf16 inputs give float32 results
    out = _token(adv.bfloat16(), T([1.0, float("nan"), 1.0, 0.5]).bfloat16(), logps.bfloat16(), mask)
    assert out.dtype == F32
    assert_close(out[1], T([-0.5, 0.0, 0.0, 0.0]))


def test_dsgrpo_sequence_sum_hand_worked():
    """Default granularity (the paper's trajectory form): A - gamma_p * log pi(y|x) / A + gamma_n * log pi(y|x)."""
    adv, rewards, logps, mask = _ds_inputs()
    out = dsgrpo_advantages(adv, rewards, logps, mask)
    # trajectory log-probs: row 0: -6 ; row 1: -0.5 ; row 2: 0 (empty) ; row 3: -8
    # row 0 correct: 0.5 + 0.06 = 0.56 ; row 1 wrong: -0.5 - 0.005 = -0.505 ; row 2: 1 ; row 3 correct: 0.08
    assert out.dtype == F32 and out.shape == (4,)
    assert_close(out, T([0.56, -0.505, 1.0, 0.08]))
    assert_close(dsgrpo_advantages(adv, rewards, logps, mask, granularity="sequence_sum"), out)
    # per-token input advantages: the row's one shift on every column (row 0: +0.06, row 1: -0.005, row 3: +0.08)
    adv_t = T([[1.0, 2.0, 3.0, 4.0]] * 4)
    out_t = dsgrpo_advantages(adv_t, rewards, logps, mask)
    assert_close(out_t[0], T([1.06, 2.06, 3.06, 4.06]))
    assert_close(out_t[1], T([0.995, 1.995, 2.995, 3.995]))
    assert_close(out_t[3], T([1.08, 2.08, 3.08, 4.08]))
    # gamma_n = 0 (DS-GRPO-Positive) and gamma_p = 0 (DS-GRPO-Negative) at gamma 0.1
    assert_close(dsgrpo_advantages(adv, rewards, logps, mask, gamma_p=0.1, gamma_n=0.0), T([1.1, -0.5, 1.0, 0.8]))
    assert_close(dsgrpo_advantages(adv, rewards, logps, mask, gamma_p=0.0, gamma_n=0.1), T([0.5, -0.55, 1.0, 0.0]))
    # NaN reward keeps A
    assert_close(dsgrpo_advantages(adv, T([1.0, float("nan"), 1.0, 0.5]), logps, mask), T([0.56, -0.5, 1.0, 0.08]))


def test_dsgrpo_rejects_unknown_granularity():
    adv, rewards, logps, mask = _ds_inputs()
    with pytest.raises(ValueError, match="granularity must be one of token, sequence_mean, sequence_sum"):
        dsgrpo_advantages(adv, rewards, logps, mask, granularity="mean")


def test_dsgrpo_hand_worked():
    adv, rewards, logps, mask = _ds_inputs()
    out = _seq_mean(adv, rewards, logps, mask)
    # row 0 correct:   0.5 - 0.01 * (-2)   = 0.52
    # row 1 incorrect: -0.5 + 0.01 * (-0.5) = -0.505
    # row 2 correct, empty: 1 - 0.01 * 0   = 1
    # row 3 correct:   0 - 0.01 * (-2)     = 0.02
    assert out.dtype == F32 and out.shape == (4,)
    assert_close(out, T([0.52, -0.505, 1.0, 0.02]))


def test_dsgrpo_variants_and_threshold():
    adv, rewards, logps, mask = _ds_inputs()
    # DS-GRPO-Positive (gamma_n = 0): the incorrect row keeps -0.5
    assert_close(_seq_mean(adv, rewards, logps, mask, gamma_n=0.0), T([0.52, -0.5, 1.0, 0.02]))
    # DS-GRPO-Negative (gamma_p = 0): correct rows keep A
    assert_close(_seq_mean(adv, rewards, logps, mask, gamma_p=0.0), T([0.5, -0.505, 1.0, 0.0]))
    # threshold 0.6: row 3 (reward 0.5) becomes incorrect: 0 + 0.1 * (-2) = -0.2 (gamma_n = 0.1)
    out = _seq_mean(adv, rewards, logps, mask, gamma_p=0.1, gamma_n=0.1, correct_threshold=0.6)
    # row 0: 0.5 + 0.2 = 0.7 ; row 1: -0.5 - 0.05 = -0.55 ; row 2: 1
    assert_close(out, T([0.7, -0.55, 1.0, -0.2]))


def test_dsgrpo_uniform_groups_are_shaped():
    # all-wrong group: A = 0 everywhere, still A~ = 0 + 0.01 * lbar = [-0.02, -0.005]
    logps = T([[-1.0, -3.0], [-0.5, 0.0]])
    mask = T([[1, 1], [1, 0]])
    out = _seq_mean(torch.zeros(2), torch.zeros(2), logps, mask)
    assert_close(out, T([-0.02, -0.005]))
    # and per token: [-0.01, -0.03], [-0.005, 0 (padding)]
    assert_close(_token(torch.zeros(2), torch.zeros(2), logps, mask), T([[-0.01, -0.03], [-0.005, 0.0]]))
    # and per trajectory (the default): 0.01 * [-4, -0.5]
    assert_close(dsgrpo_advantages(torch.zeros(2), torch.zeros(2), logps, mask), T([-0.04, -0.005]))


def test_dsgrpo_shapes_bf16_nan_reward():
    adv, rewards, logps, mask = _ds_inputs()
    expected = T([0.52, -0.505, 1.0, 0.02])
    assert_close(_seq_mean(adv.unsqueeze(-1), rewards, logps, mask), expected)
    adv_t = adv.unsqueeze(-1) * T([1.0, -1.0, 2.0])  # (B, 3)
    out = _seq_mean(adv_t, rewards, logps, mask)
    assert out.shape == (4, 3)
    assert_close(out, adv_t + (expected - adv).unsqueeze(-1))
    # bf16: all values exactly representable
    out = _seq_mean(adv.bfloat16(), rewards.bfloat16(), logps.bfloat16(), mask)
    assert out.dtype == F32
    assert_close(out, expected)
    # NaN reward (unscorable) keeps A
    out = _seq_mean(adv, T([1.0, float("nan"), 1.0, 0.5]), logps, mask)
    assert_close(out, T([0.52, -0.5, 1.0, 0.02]))


# ----------------------------------------------------------------------------------------------
# ppl_shaped_advantages
# ----------------------------------------------------------------------------------------------


def test_ppl_shaped_hand_worked():
    # G = 2. group 1: lbar [-1, -3] -> lnPPL [1, 3], mean 2, unbiased std sqrt(2) = 1.4142136
    #   w = [-1, 1] / (1.4142136 + 1e-6) = [-0.7071063, 0.7071063]
    #   A~ = A * (1 - 0.01 w): 1 * 1.0070711 = 1.0070711 ; -1 * 0.9929289 = -0.9929289
    # group 2: lbar [-2, -2] (one is a one-token completion) -> std 0 -> w = 0 -> A kept
    logps = T([[-1.0, -1.0, 0.0], [-3.0, -2.0, -4.0], [-2.0, 0.0, 0.0], [-1.0, -3.0, 0.0]])
    mask = T([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    adv = T([1.0, -1.0, 0.7, -0.7])
    out = ppl_shaped_advantages(adv, logps, mask, 2)
    assert out.dtype == F32 and out.shape == (4,)
    assert_close(out, T([1.0070711, -0.9929289, 0.7, -0.7]))


def test_ppl_shaped_empty_row_and_alpha():
    # G = 3: lbar [0 (empty row), -1, -2] -> lnPPL [0, 1, 2], mean 1, std 1 -> w = [-1, 0, 1] / (1 + 1e-6)
    # alpha = 0.1, A = 2 each: 2 * (1 + 0.0999999) = 2.2, 2, 2 * (1 - 0.0999999) = 1.8
    logps = T([[3.0, 3.0], [-1.0, 0.0], [-2.0, -2.0]])
    mask = T([[0, 0], [1, 0], [1, 1]])
    out = ppl_shaped_advantages(T([2.0, 2.0, 2.0]), logps, mask, 3, alpha=0.1)
    assert_close(out, T([2.2, 2.0, 1.8]))


def test_ppl_shaped_shapes_bf16_single_generation():
    logps = T([[-1.0, -1.0, 0.0], [-3.0, -2.0, -4.0], [-2.0, 0.0, 0.0], [-1.0, -3.0, 0.0]])
    mask = T([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    adv = T([1.0, -1.0, 0.7, -0.7])
    expected = T([1.0070711, -0.9929289, 0.7, -0.7])
    assert_close(ppl_shaped_advantages(adv.unsqueeze(-1), logps, mask, 2), expected)
    adv_t = adv.unsqueeze(-1) * T([1.0, 0.5])  # (B, 2): each column scaled by the same factor
    factor = T([1.0070711, 0.9929289, 1.0, 1.0]).unsqueeze(-1)
    assert_close(ppl_shaped_advantages(adv_t, logps, mask, 2), adv_t * factor)
    out = ppl_shaped_advantages(adv.bfloat16(), logps.bfloat16(), mask, 2)
    assert out.dtype == F32
    assert_close(out, expected, atol=2e-3, rtol=0)  # bf16(0.7) = 0.69921875
    # G = 1: w = 0, advantages unchanged
    assert_close(ppl_shaped_advantages(adv, logps, mask, 1), adv)


# ----------------------------------------------------------------------------------------------
# position_bonus_advantages
# ----------------------------------------------------------------------------------------------

# 5 valid tokens: l = [0, .25, .5, .75, 1]; sigmoid(15 (l - .5)) = sigmoid([-7.5, -3.75, 0, 3.75, 7.5])
#   = [5.5277864e-4, 0.0229774, 0.5, 0.9770226, 0.9994472]; times gamma 0.1:
B5 = T([5.5277864e-5, 0.0022977370, 0.05, 0.0977022630, 0.0999447221])


def test_position_bonus_hand_worked():
    mask = T([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    adv = T([2.0, -1.0, 0.5, 3.0, 0.0])
    out = position_bonus_advantages(adv, mask)
    assert out.dtype == F32 and out.shape == (5, 5)
    assert_close(out[0], 2.0 + B5)  # A > 0: A + b_t
    assert_close(out[1], -1.0 - B5)  # A < 0: A - b_t
    # one-token completion: l = 1 -> b = 0.0999447; padding keeps A = 0.5
    assert_close(out[2], T([0.5999447, 0.5, 0.5, 0.5, 0.5]))
    assert_close(out[3], torch.full((5,), 3.0))  # empty row: all padding keeps A
    assert_close(out[4], torch.zeros(5))  # sign(0) = 0: no bonus


def test_position_bonus_padding_direction_and_params():
    # 3 valid tokens of 5: l = [0, .5, 1]; direction -1, scale 2, center 0, gamma 1:
    # b = sigmoid(-2 * l) = [0.5, sigmoid(-1) = 0.2689414, sigmoid(-2) = 0.1192029]
    mask = T([[1, 1, 1, 0, 0]])
    out = position_bonus_advantages(T([1.0]), mask, gamma=1.0, direction=-1.0, scale=2.0, center=0.0)
    assert_close(out, T([[1.5, 1.2689414, 1.1192029, 1.0, 1.0]]))


def test_position_bonus_literal_report_center_is_flat():
    """The report prints n = -0.5: sigmoid(15 * (l + 0.5)) over l = [0, .25, .5, .75, 1] is flat near gamma for d = 1
    and near 0 for d = -1, why the default re-centres to n = 0.5 (bonus rising from ~0 to ~gamma)."""
    mask = torch.ones(1, 5)
    lit = position_bonus_advantages(T([1.0]), mask, center=-0.5)
    assert_close(lit, T([[1.0999447, 1.0999987, 1.1, 1.1, 1.1]]))
    lit_down = position_bonus_advantages(T([1.0]), mask, direction=-1.0, center=-0.5)
    assert_close(lit_down, T([[1.0000553, 1.0000013, 1.0, 1.0, 1.0]]), atol=1e-7, rtol=0)
    # default (re-centred): 0.1 * sigmoid(15 * (l - 0.5)) = [5.53e-5, 0.0022977, 0.05, 0.0977023, 0.0999447]
    assert_close(position_bonus_advantages(T([1.0]), mask), T([[1.0000553, 1.0022977, 1.05, 1.0977023, 1.0999447]]))


def test_position_bonus_advantage_shapes_and_bf16():
    mask = torch.ones(2, 5)
    adv = T([2.0, -1.0])
    ref = position_bonus_advantages(adv, mask)
    assert_close(position_bonus_advantages(adv.unsqueeze(-1), mask), ref)
    # (B, T): the sign is taken per token
    adv_t = T([[1.0, -1.0, 0.0, 2.0, -2.0], [0.5, 0.5, 0.5, 0.5, 0.5]])
    out = position_bonus_advantages(adv_t, mask)
    assert_close(out[0], adv_t[0] + T([1.0, -1.0, 0.0, 1.0, -1.0]) * B5)
    assert_close(out[1], 0.5 + B5)
    # bf16 advantages: float32 out, same values (2 and -1 are exact in bf16)
    out = position_bonus_advantages(adv.bfloat16(), mask.bfloat16())
    assert out.dtype == F32
    assert_close(out, ref)
    with pytest.raises(ValueError):
        position_bonus_advantages(torch.ones(2, 3), mask)

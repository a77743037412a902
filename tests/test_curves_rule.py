"""The budget experiment's rule (`experiments/curves_rule.py`), on hand-worked numbers."""

import math

import pytest

from exploration_trl.experiments import curves_rule as cr


def rows(points):
    """`points`: step -> [(pass@1, pass@64) per seed]."""
    return [{"step": step, "seed": i, "pass@1": p1, "pass@64": p64}
            for step, seeds in points.items() for i, (p1, p64) in enumerate(seeds)]


# GRPO: (0.20, 0.95) -> (0.30, 0.90) -> (0.40, 0.80); every pass@64 +-0.01 over 2 seeds: standard error 0.01.
GRPO = rows({0: [(0.2, 0.94), (0.2, 0.96)], 100: [(0.3, 0.89), (0.3, 0.91)], 200: [(0.4, 0.79), (0.4, 0.81)]})
START = {0: [(0.2, 0.94), (0.2, 0.96)]}


def test_trajectory_means_and_standard_errors():
    t = cr.trajectory(GRPO)
    assert [p[0] for p in t] == [0, 100, 200]
    assert t[1][1] == pytest.approx(0.3) and t[1][2] == pytest.approx(0.9)
    assert t[1][3] == pytest.approx(0.01) and t[1][4] == 2  # std 0.01414 / sqrt(2)
    assert cr.mean_se([0.5]) == (0.5, None)


def test_baseline_is_interpolated_at_the_same_pass1():
    value, se = cr.baseline_at(0.35, [cr.trajectory(GRPO)])
    assert value == pytest.approx(0.85) and se == pytest.approx(0.01)
    assert cr.baseline_at(0.5, [cr.trajectory(GRPO)]) is None  # no extrapolation
    assert cr.baseline_at(0.1, [cr.trajectory(GRPO)]) is None


def test_beats_when_more_than_two_combined_standard_errors_above():
    method = cr.trajectory(rows({**START, 100: [(0.35, 0.89), (0.35, 0.91)]}))  # 0.90 vs 0.85, se 0.01 each
    v = cr.verdict(method, [cr.trajectory(GRPO)])
    assert v["verdict"] == "beats"
    assert v["best"]["difference"] == pytest.approx(0.05)
    assert v["best"]["combined_se"] == pytest.approx(math.sqrt(2) * 0.01)
    assert v["best"]["z"] == pytest.approx(0.05 / (math.sqrt(2) * 0.01))


def test_within_two_standard_errors_is_no():
    method = cr.trajectory(rows({**START, 100: [(0.35, 0.86), (0.35, 0.88)]}))  # +0.02: z = 1.41
    v = cr.verdict(method, [cr.trajectory(GRPO)])
    assert v["verdict"] == "no" and v["best"]["z"] == pytest.approx(0.02 / (math.sqrt(2) * 0.01))


def test_below_at_the_last_step():
    method = cr.trajectory(rows({**START, 100: [(0.35, 0.84), (0.35, 0.86)], 200: [(0.35, 0.79), (0.35, 0.81)]}))
    v = cr.verdict(method, [cr.trajectory(GRPO)])
    assert v["verdict"] == "below" and v["last"]["step"] == 200 and v["last"]["difference"] == pytest.approx(-0.05)


def test_no_verdict_outside_the_range_or_with_one_seed():
    outside = cr.trajectory(rows({**START, 100: [(0.5, 0.99), (0.5, 0.99)]}))
    assert cr.verdict(outside, [cr.trajectory(GRPO)])["verdict"] == "no verdict"
    one_seed = cr.trajectory([r for r in rows({**START, 100: [(0.35, 0.99)]})])
    assert cr.verdict(one_seed, [cr.trajectory(GRPO)])["verdict"] == "no verdict"


def test_several_baselines_use_their_upper_envelope():
    low = cr.trajectory(rows({0: [(0.2, 0.70), (0.2, 0.72)], 100: [(0.4, 0.70), (0.4, 0.72)]}))
    value, _ = cr.baseline_at(0.35, [low, cr.trajectory(GRPO)])
    assert value == pytest.approx(0.85)
    method = cr.trajectory(rows({**START, 100: [(0.35, 0.86), (0.35, 0.88)]}))
    assert cr.verdict(method, [low])["verdict"] == "beats"
    assert cr.verdict(method, [low, cr.trajectory(GRPO)])["verdict"] == "no"

"""docs/math.md describes what the code computes: its worked examples are recomputed here from the code, every
citation of the page in the package names one of its headings, and no file cites the SPEC.md it replaces."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from exploration_trl.core import (
    clip_cov_select, group_advantages, passk_advantages, pkpo_advantages, pkpo_transform, unlikeliness_rewards,
)
from exploration_trl.experiments.confirmatory import protocol, verdict

ROOT = Path(__file__).resolve().parent.parent
MATH = ROOT / "docs" / "math.md"
#: Files whose bytes are pinned to the pre-registration commit (tests/test_confirmatory_report.py) or left to the
#: protocol's owner; they still cite SPEC.md.
#: Files allowed to cite SPEC.md: none (the verdict code, once pinned byte for byte, is now pinned by its numbers).
PINNED: set[str] = set()


def page() -> str:
    """The page's text with every run of whitespace one space (so a quote may span a line break)."""
    return " ".join(MATH.read_text(encoding="utf-8").split())


def numbers(values, digits: int = 4) -> str:
    """`[1.4997, −0.4999]`: the page's way of writing a vector (U+2212 minus signs)."""
    return "[" + ", ".join(f"{v:.{digits}f}".replace("-", "−") for v in values) + "]"


def headings() -> set[str]:
    return {m.group(1) for m in re.finditer(r"^#{2,3} (.+)$", MATH.read_text(encoding="utf-8"), re.MULTILINE)}


def test_grpo_example():
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0]), 4)
    assert f"rewards `[1, 0, 0, 0]` give `{numbers(adv)}` (`std = 0.5`)" in page()
    # an all-equal group and a group with one scorable row get 0
    nan = float("nan")
    assert group_advantages(torch.tensor([1.0, 1, 1, 1, 1, nan, nan, nan]), 4).tolist() == [0.0] * 8


def test_progrpo_sign_flip_example():
    adv = group_advantages(torch.tensor([1.0] * 15 + [0.0]), 16)
    assert adv[0].item() == pytest.approx(0.25, abs=1e-3)
    assert "with `G = 16` and 15 correct, a correct row's `A = 0.25 < α`" in page()


def test_passk_example():
    adv = passk_advantages(torch.tensor([True, False, False, False]), 4, 2)
    assert f"`A_pos = {adv[0]:.4f}`, `A_neg = (0.5 − 2/3) / 0.5 = {numbers([adv[1]])[1:-1]}`" in page()
    # fewer wrong rows than k: every subset passes, all advantages 0
    assert passk_advantages(torch.tensor([True, True, True, False]), 4, 2).tolist() == [0.0] * 4


def test_pkpo_example():
    r = torch.tensor([1.0, 0, 0, 0])
    assert pkpo_transform(r, 4, 2, "s").tolist() == pytest.approx([1, 1 / 3, 1 / 3, 1 / 3])
    assert pkpo_transform(r, 4, 2, "sloo_minus_one").tolist() == pytest.approx([1, 0, 0, 0])
    sloo = pkpo_transform(r, 4, 2, "sloo")
    adv = pkpo_advantages(r, 4, 2, "sloo_minus_one")
    text = page()
    assert "`u = [1, 1/3, 1/3, 1/3]`; `sloo_minus_one` gives `t = [1, 0, 0, 0]`" in text
    assert f"advantages `[{adv[0]:.4f}, 0, 0, 0]`" in text
    assert f"`sloo` gives `t = {numbers(sloo)}`".replace("[1.0000,", "[1,") in text
    # sloo is not centred: a group's t sums to -n/(n-1) rho_k(g)
    g = torch.tensor([0.3, 1.0, 0.0, 0.5])
    rho = sum(math.comb(i, 1) * v for i, v in enumerate(sorted(g.tolist()))) / math.comb(4, 2)
    assert pkpo_transform(g, 4, 2, "sloo").sum().item() == pytest.approx(-4 / 3 * rho, abs=1e-6)


def test_unlikeliness_example():
    nan = float("nan")
    logps = torch.tensor([[-1.0, -1.0], [-0.1, -0.1], [-2.0, -2.0], [-0.5, -0.5]])
    out = unlikeliness_rewards(torch.tensor([1.0, 1.0, 0.1, nan]), logps, torch.ones(4, 2), 4, 0.25)
    assert out[:3].tolist() == pytest.approx([0.9375, 0.8125, 0.1]) and math.isnan(out[3])
    assert ("rewards `[1, 1, 0.1, NaN]` with mean log-probs `[−1, −0.1, −2, −0.5]` give ranks `[1, 3, 0, 2]` and "
            "`r' = [0.9375, 0.8125, 0.1, NaN]`") in page()


def test_clip_cov_cuts_one_candidate_at_ratio_zero():
    torch.manual_seed(0)
    logps = torch.randn(2, 8) * 3
    chosen = clip_cov_select(logps, logps.clone(), torch.tensor([3.0, -3.0]), torch.ones(2, 8), clip_cov_ratio=0.0,
                             cov_lb=-1e9, cov_ub=1e9)
    assert int(chosen.sum()) == 1
    assert "`clip_cov_ratio: 0` still cuts one candidate per selection" in page()


def test_position_bonus_literal_midpoint_is_flat():
    assert 1 / (1 + math.exp(-7.5)) == pytest.approx(0.9994, abs=5e-5)
    assert "`σ(15 (l + 0.5)) ≥ σ(7.5) = 0.9994`" in page()


def test_confirmatory_numbers():
    text = page()
    t = verdict.t_factor(4)
    assert f"`{math.sqrt(5 / 4):.4f} × {t:.4f} = {math.sqrt(5 / 4) * t:.4f}`" in text
    pre = protocol.PRE_RUN_NULL
    assert (f"{100 * pre['inflate_t']['700']:.2f}% and {100 * pre['inflate_t']['1500']:.2f}% at the two checkpoints, "
            f"where the plain bootstrap gave {100 * pre['none']['1500']:.2f}% at the final one") in text
    assert f"({math.comb(10, 5) // 2} splits, each unordered split once)" in text
    # Holm as the page writes it: p_holm,(j) = max over i <= j of min(1, (m - i + 1) p_(i)); None counts in m
    assert verdict.holm([0.01, None, 0.04, 0.03]) == [0.04, None, 0.09, 0.09]
    assert "`p_holm,(j) = max_{i ≤ j} min(1, (m − i + 1) · p_(i))`" in text


def test_methods_added_later_have_their_section():
    """The 0.8.0 methods: each has its subsection, naming the core function(s) that compute it."""
    text = MATH.read_text(encoding="utf-8")
    section = text.split("## Methods added in 0.8.0\n", 1)[1]
    for heading, functions in (("MaxRL", ["maxrl_advantages"]), ("W-REINFORCE", ["weighted_reinforce_advantages"]),
                               ("QAE", ["quantile_advantages"]), ("Entropy-based advantage", ["entropy_shaped_advantages"]),
                               ("Outcome-based exploration", ["outcome_ucb_bonus", "outcome_batch_penalty"])):
        assert f"### {heading}\n" in section
        body = section.split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
        assert all(f"`{f}(" in body for f in functions), heading


def test_package_citations_name_headings_of_the_page():
    cited = []
    for path in (ROOT / "exploration_trl").rglob("*.py"):
        text = " ".join(path.read_text(encoding="utf-8").replace("#", " ").split())
        cited += [(path, m.group(1)) for m in re.finditer(r'docs/math\.md, "([^"]+)"', text)]
    assert len(cited) >= 4
    known = headings()
    assert [(str(p.relative_to(ROOT)), h) for p, h in cited if h not in known] == []


def test_no_file_cites_spec_md():
    files = [p for p in (ROOT / "exploration_trl").rglob("*.py")] + list((ROOT / "docs").rglob("*.md"))
    files += [ROOT / "README.md"]
    citing = sorted(str(p.relative_to(ROOT)) for p in files if "SPEC.md" in p.read_text(encoding="utf-8"))
    assert set(citing) <= PINNED, citing

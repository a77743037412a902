"""Advantage estimators that replace GRPO's mean/std normalisation (pure torch, no TRL import): MaxRL,
Weighted REINFORCE and Quantile Advantage Estimation.

Conventions as in `advantages.py` (docs/math.md): `B = num_prompts * G` rows, the `G` completions of a prompt
contiguous; results are float32 `(B,)`; rows marked invalid (an unscored completion) get advantage 0 and take no
part in their group's statistics. Nothing here reads the device on the host.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from .utils import check_groups, flat_rows, nanstd, to_f32

__all__ = [
    "maxrl_advantages",
    "weighted_reinforce_advantages",
    "WREINFORCE_MODES",
    "quantile_advantages",
    "QAE_QUANTILE_METHODS",
]

#: `weighted_reinforce_advantages` modes: the paper's W-REINFORCE, and its PSR-only and NSR-only objectives.
WREINFORCE_MODES = ("weighted", "psr", "nsr")
#: `quantile_advantages` quantile definitions: the paper's right-continuous empirical quantile, or linear
#: interpolation between order statistics (`torch.quantile`'s default, which the authors' code calls).
QAE_QUANTILE_METHODS = ("inverted_cdf", "linear")

#: Largest denominator of the quantile level K as a fraction (`_level_fraction`): keeps `K * n` exact in int64.
_MAX_LEVEL_DENOMINATOR = 10**9


def _valid_rows(correct: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    c = flat_rows(correct, "correct").bool()
    v = torch.ones_like(c) if valid is None else flat_rows(valid, "valid").bool().to(c.device)
    return c & v, v


def maxrl_advantages(correct: torch.Tensor, num_generations: int, valid: torch.Tensor | None = None,
                     eps: float = 1e-6) -> torch.Tensor:
    """MaxRL (Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning", arXiv 2602.02710, Eq. 11 and
    Algorithm 1).

    With binary rewards `r` (`correct`), each completion's advantage is its reward minus the group's mean reward
    `r_hat`, divided by that mean: `A = (r - r_hat) / (r_hat + eps)` (Eq. 11, the estimator of Eq. 10 with the group
    mean as control variate). A correct completion gets `G/K - 1` and a wrong one `-1` (K correct among G).

    The update `sum_j A_j grad log pi(o_j)` is then an unbiased estimate of the gradient of the truncated
    maximum-likelihood objective `sum_{k<=G} (1/k) grad pass@k` (Thm. 2), not of pass@1 as GRPO's, under two
    conditions this function cannot see: the samples come from the policy being differentiated (one update per
    rollout), and the loss weights every completion of a prompt alike (a token sum, or one normaliser for the batch;
    not a per-completion length mean). The trainer warns when its settings break either.

    A group without a correct completion (`r_hat = 0`) gets 0, as Algorithm 1 gives (the text around Eq. 11 says
    both terms are dropped when K = 0); so does an all-correct group (every `r - r_hat` is 0), and a group with one
    scored completion (its `r - r_hat` is 0; the authors' code gives a group of one `r / eps`). `eps` is the authors'
    code's 1e-6; `eps=0` is Algorithm 1 exactly. Rows with `valid` False are left out of `r_hat` and get 0.
    """
    c, v = _valid_rows(correct, valid)
    n_groups = check_groups(c.shape[0], num_generations)
    r = c.float().view(n_groups, num_generations)
    counts = v.float().view(n_groups, num_generations).sum(dim=1, keepdim=True)
    mean = r.sum(dim=1, keepdim=True) / counts.clamp(min=1.0)
    adv = torch.where(mean > 0, (r - mean) / (mean + eps), torch.zeros_like(r))
    return torch.where(v.view(n_groups, num_generations), adv, torch.zeros_like(adv)).reshape(-1)


def weighted_reinforce_advantages(correct: torch.Tensor, valid: torch.Tensor | None = None,
                                  positive_weight: float = 0.1, mode: str = "weighted") -> torch.Tensor:
    """Weighted REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
    Reasoning", arXiv 2506.01347, Sec. 5, Eq. 9; the objective `lambda * L_PSR + L_NSR` with rewards +1 / -1 and no
    baseline, L_PSR and L_NSR as Eq. 3 and Eq. 4).

    `mode="weighted"` (W-REINFORCE): a correct completion's advantage is `positive_weight` (the paper's lambda =
    0.1), a wrong one's -1. `"psr"` (positive sample reinforcement only): +1 and 0. `"nsr"` (negative sample
    reinforcement only): 0 and -1. No group statistic is used, so an all-correct or all-wrong group still moves
    the policy. Rows with `valid` False get 0.
    """
    if mode not in WREINFORCE_MODES:
        raise ValueError(f"mode is {mode!r}; choose one of {', '.join(WREINFORCE_MODES)}")
    c, v = _valid_rows(correct, valid)
    wrong = v & ~c
    pos = {"weighted": float(positive_weight), "psr": 1.0, "nsr": 0.0}[mode]
    neg = 0.0 if mode == "psr" else -1.0
    return c.float() * pos + wrong.float() * neg


def _level_fraction(k: float) -> tuple[int, int]:
    """`(p, q)` with `p / q` the quantile level K as written: the shortest decimal that gives the float (`repr`), so
    0.6 is 3/5 and not the binary float just below it, in lowest terms (a denominator above 1e9, K with more than nine
    decimals, is rounded to the nearest fraction with one of at most 1e9). Host arithmetic on a Python float, once per
    call; nothing is read from the device."""
    level = Fraction(repr(float(k)))
    if level.denominator > _MAX_LEVEL_DENOMINATOR:
        level = level.limit_denominator(_MAX_LEVEL_DENOMINATOR)
    return level.numerator, level.denominator


def _inverted_cdf(grouped: torch.Tensor, k: float) -> torch.Tensor:
    """Per row, `inf{x : F(x) >= k}` of the row's non-NaN values: the `ceil(k * n)`-th smallest (NaN for none).

    The rank is computed in integers, `ceil(p * n / q) = (p * n + q - 1) // q` with `k = p / q` exactly
    (`_level_fraction`), so a group whose `k * n` is a whole number (n = 25, K = 0.6: the 15th smallest) is never
    pushed to the next rank by rounding."""
    p, q = _level_fraction(k)
    ordered = torch.sort(grouped, dim=1).values  # NaN sort last
    n = (~torch.isnan(grouped)).sum(dim=1)
    rank = torch.div(n * p + (q - 1), q, rounding_mode="floor").clamp(min=1)
    index = (torch.minimum(rank, n.clamp(min=1)) - 1).unsqueeze(1)
    return ordered.gather(1, index).squeeze(1)


def quantile_advantages(rewards: torch.Tensor, num_generations: int, k: float = 0.4,
                        method: str = "inverted_cdf", scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """Quantile Advantage Estimation (Wu et al. 2025, arXiv 2509.22611, Sec. 4, Eq. 3 and Eq. 4): GRPO with the
    group's mean replaced by its K-quantile, `A = (r - b_K) / (std_group(r) + eps)`.

    `method="inverted_cdf"` is the paper's right-continuous quantile `b_K = inf{x : F_hat(x) >= K}`; on binary
    rewards it is 0 while the share of correct completions is at most `1 - K` (only correct completions get a
    non-zero advantage) and 1 above it (only wrong ones do), so most completions get exactly 0. `"linear"`
    interpolates between order statistics as `torch.quantile` does (the authors' code); the two agree for every
    binary group when `K * (G - 1)` is an integer (e.g. K = 0.4 and G = 16, the group size of verl's DAPO recipe that
    the authors' runs start from). The rank `ceil(K * n)` is exact for every group size n (K read as the decimal it
    is written as, `_level_fraction`).

    `scale` follows TRL's `scale_rewards`: "group" (the group's Bessel std, as GRPO), "batch" (the whole batch's)
    or "none" (no division). NaN rewards take no part in the quantile or std and get 0. A group with one scored
    completion gets 0 (its quantile is its own reward), whatever `scale`; verl's advantage code, which the authors'
    runs use, gives a group of one its reward instead (mean 0, std 1 there).
    """
    if method not in QAE_QUANTILE_METHODS:
        raise ValueError(f"method is {method!r}; choose one of {', '.join(QAE_QUANTILE_METHODS)}")
    if not 0.0 < k < 1.0:
        raise ValueError(f"k is {k}; the quantile level must lie in (0, 1) (paper: 0.4)")
    r = to_f32(flat_rows(rewards, "rewards"))
    n_groups = check_groups(r.shape[0], num_generations)
    grouped = r.view(n_groups, num_generations)
    if method == "inverted_cdf":
        baseline = _inverted_cdf(grouped, k)
    else:
        baseline = torch.nanquantile(grouped, k, dim=1, interpolation="linear")
    adv = r - baseline.repeat_interleave(num_generations)
    if scale == "group":
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations) if num_generations > 1 else torch.zeros_like(r)
        adv = adv / (std + eps)
    elif scale == "batch":
        std = nanstd(r).expand_as(r) if r.numel() > 1 else torch.zeros_like(r)
        adv = adv / (std + eps)
    elif scale != "none":
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    return torch.nan_to_num(adv, nan=0.0)


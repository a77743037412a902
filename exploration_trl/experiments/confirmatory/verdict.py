"""The confirmatory test (docs/math.md, "The confirmatory verdict"): a method's distance to GRPO's trajectory at the
same pass@1, a seed-level bootstrap over both arms, a one-sided p and Holm's step-down correction.

Data: GRPO's runs as an array `(seeds, checkpoints, 2)` of `(pass@1, pass@64)` (every GRPO seed evaluated at the
same steps); a method at one named checkpoint as `(seeds, 2)`.

* `f_GRPO` is the piecewise-linear curve through GRPO's seed-mean points, ordered by pass@1 (GRPO's pass@1 rises
  with the steps; ordering by pass@1 keeps the curve a function where two checkpoints swap order by noise), read at
  a pass@1 and never extrapolated.
* `d_s = pass@64_s - f_GRPO(pass@1_s)`; the effect is the mean of `d_s`.
* The bootstrap resamples the method's seeds and GRPO's seeds with replacement and rebuilds `f_GRPO` each time.
  With 5 seeds per arm the plain percentile bootstrap is anti-conservative (a resampled mean varies by
  `(n-1)/n` of the sample variance, and its tails are normal where a 5 + 5 seed comparison has Student tails):
  every seed's deviation from its arm's mean is first scaled by `sqrt(n/(n-1))` (the resampled means' variance
  becomes the unbiased one) times `t_{min(n_g, n_m)-1}(0.95) / z(0.95)` (Welch's conservative degrees of freedom)
  (`CORRECTION = "inflate_t"`). The null
  simulation (`null_false_positive_rate`) chose it: with the exploratory seed noise, `none` and `inflate` alone
  exceed 5% at the final checkpoint (numbers in `protocol.py`).
* The one-sided p is the share of resampled effects `<= 0`; a resample in which a method seed falls outside the
  rebuilt curve's pass@1 range counts as `<= 0` (conservative). On the real data a method seed outside GRPO's range
  gives no verdict (`effect`, `p` None and `reason` set).
"""

from __future__ import annotations

from typing import Any

import numpy as np

CORRECTIONS = ("none", "inflate", "inflate_t")
CORRECTION = "inflate_t"
#: How the effect reads GRPO's curve: at each method seed's pass@1, averaging the seeds' distances (`per_seed`, the
#: 0.7.0 protocol), or once, at the seeds' mean pass@1, against their mean pass@n (`mean_point`, the second
#: protocol). The piecewise-linear curve bends at GRPO's checkpoints, so averaging it over the seeds' scattered pass@1
#: is biased where it bends (by about the change of slope times the pass@1 spread / sqrt(2 pi) at a bend): a GRPO
#: seed compared with GRPO at one of GRPO's own checkpoints sits exactly on a bend. `calibration.py` measures it.
ESTIMATORS = ("per_seed", "mean_point")
ESTIMATOR = "per_seed"


def curve(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(x, y)` of `f_GRPO` from seed-mean points `(checkpoints, 2)`, ordered by pass@1."""
    order = np.argsort(points[:, 0], kind="stable")
    return points[order, 0], points[order, 1]


def read_curve(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """`f(at)` by linear interpolation; NaN outside `[x[0], x[-1]]` (never extrapolated)."""
    at = np.asarray(at, dtype=float)
    out = np.interp(at, x, y)
    return np.where((at < x[0]) | (at > x[-1]), np.nan, out)


def distances(grpo: np.ndarray, method: np.ndarray) -> np.ndarray:
    """`d_s` per method seed (NaN where the seed's pass@1 is outside GRPO's range)."""
    x, y = curve(np.asarray(grpo, float).mean(axis=0))
    method = np.asarray(method, float)
    return method[:, 1] - read_curve(x, y, method[:, 0])


def t_factor(df: int, level: float = 0.95) -> float:
    """`t_df(level) / z(level)`: how much wider a Student t tail with `df` degrees of freedom is than the normal's."""
    from scipy import stats

    return float(stats.t.ppf(level, df) / stats.norm.ppf(level))


def _inflate(values: np.ndarray, correction: str, df: int, spread: float = 1.0) -> np.ndarray:
    """Each seed's deviation from the arm's mean scaled by `sqrt(n/(n-1))` (`inflate`), times `t_factor(df)`
    (`inflate_t`), or unchanged (`none`)."""
    if correction not in CORRECTIONS:
        raise ValueError(f"correction is {correction!r} but must be one of {CORRECTIONS}")
    n = values.shape[0]
    if correction == "none" or n < 2:
        return values
    scale = np.sqrt(n / (n - 1)) * (t_factor(df) if correction == "inflate_t" else 1.0) * spread
    mean = values.mean(axis=0, keepdims=True)
    return mean + (values - mean) * scale


def _batched_read(xs: np.ndarray, ys: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Piecewise-linear reads of B curves at once: `xs, ys` `(B, K)` sorted along K, `at` `(B, M)`; NaN outside."""
    k = xs.shape[1]
    idx = (xs[:, None, :] <= at[:, :, None]).sum(axis=2)  # (B, M): number of knots at or left of the query
    lo = np.clip(idx - 1, 0, k - 2)
    hi = lo + 1
    x0, x1 = np.take_along_axis(xs, lo, 1), np.take_along_axis(xs, hi, 1)
    y0, y1 = np.take_along_axis(ys, lo, 1), np.take_along_axis(ys, hi, 1)
    span = np.where(x1 > x0, x1 - x0, 1.0)
    t = np.where(x1 > x0, (at - x0) / span, 0.0)
    out = y0 + t * (y1 - y0)
    outside = (at < xs[:, :1]) | (at > xs[:, -1:])
    return np.where(outside, np.nan, out)


def point_effect(grpo: np.ndarray, method: np.ndarray) -> float:
    """`mean pass@n - f_GRPO(mean pass@1)` of the method's seeds (NaN outside GRPO's pass@1 range)."""
    x, y = curve(np.asarray(grpo, float).mean(axis=0))
    m = np.asarray(method, float).mean(axis=0)
    return float(m[1] - read_curve(x, y, np.array([m[0]]))[0])


def bootstrap_effects(grpo: np.ndarray, method: np.ndarray, resamples: int, seed: int,
                      correction: str = CORRECTION, estimator: str = ESTIMATOR, spread: float = 1.0) -> np.ndarray:
    """Resampled effects `(resamples,)`; NaN where a method seed (`per_seed`), or the seeds' mean pass@1
    (`mean_point`), fell outside the rebuilt curve. `spread` widens every seed's deviation from its arm's mean once
    more (1: as `correction` says; the second protocol calibrates it on GRPO's null, `calibration.py`)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator is {estimator!r} but must be one of {ESTIMATORS}")
    rng = np.random.default_rng(seed)
    n_g, n_m = np.shape(grpo)[0], np.shape(method)[0]
    df = max(1, min(n_g, n_m) - 1)  # the conservative bound on Welch's degrees of freedom
    g = _inflate(np.asarray(grpo, float), correction, df, spread)
    m = _inflate(np.asarray(method, float), correction, df, spread)
    gi = rng.integers(0, n_g, size=(resamples, n_g))
    mi = rng.integers(0, n_m, size=(resamples, n_m))
    means = g[gi].mean(axis=1)  # (B, K, 2)
    order = np.argsort(means[:, :, 0], axis=1, kind="stable")
    xs = np.take_along_axis(means[:, :, 0], order, 1)
    ys = np.take_along_axis(means[:, :, 1], order, 1)
    pts = m[mi]  # (B, n_m, 2)
    if estimator == "mean_point":
        centre = pts.mean(axis=1)  # (B, 2)
        return centre[:, 1] - _batched_read(xs, ys, centre[:, :1])[:, 0]
    d = pts[:, :, 1] - _batched_read(xs, ys, pts[:, :, 0])
    return d.mean(axis=1)  # NaN propagates: any seed outside -> NaN


def test(grpo: np.ndarray, method: np.ndarray, resamples: int = 10_000, seed: int = 0,
         correction: str = CORRECTION, level: float = 0.95, estimator: str = ESTIMATOR,
         spread: float = 1.0) -> dict[str, Any]:
    """`{effect, ci, p, distances, outside_resamples, reason}` of one (setting, checkpoint). `estimator="mean_point"`
    adds `effect_per_seed`, the mean of the seeds' distances, beside its effect."""
    d = distances(grpo, method)
    base = {"distances": [None if np.isnan(v) else float(v) for v in d], "resamples": resamples,
            "bootstrap_seed": seed, "correction": correction}
    if estimator == "mean_point":
        effect = point_effect(grpo, method)
        base.update(estimator=estimator, effect_per_seed=None if np.isnan(d).any() else float(d.mean()))
        outside = np.isnan(effect)
        why = "the seeds' mean pass@1 is outside GRPO's pass@1 range (no extrapolation)"
    else:
        effect, outside = (float(d.mean()) if not np.isnan(d).any() else None), bool(np.isnan(d).any())
        why = "a seed's pass@1 is outside GRPO's pass@1 range (no extrapolation)"
    if outside:
        return {**base, "effect": None, "ci": None, "p": None, "outside_resamples": None, "reason": why}
    eff = bootstrap_effects(grpo, method, resamples, seed, correction, estimator, spread)
    outside = np.isnan(eff)
    p = float((outside | (np.nan_to_num(eff, nan=-1.0) <= 0)).mean())
    valid = np.where(outside, -1.0, eff)  # an outside resample counts at the lowest possible effect
    lo, hi = np.quantile(valid, [(1 - level) / 2, (1 + level) / 2])
    return {**base, "effect": float(effect), "ci": [float(lo), float(hi)], "p": p,
            "outside_resamples": float(outside.mean()), "reason": None}


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (monotone, capped at 1). None (no verdict) stays None but still counts in
    the number of hypotheses, as if its p were 1 (conservative: the family is the pre-registered one)."""
    known = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(pvalues)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def null_false_positive_rate(mean_curve: np.ndarray, sd: np.ndarray, checkpoint_index: int, n_grpo: int = 5,
                             n_method: int = 5, simulations: int = 1000, resamples: int = 2000, seed: int = 0,
                             correction: str = CORRECTION, alpha: float = 0.05) -> dict[str, Any]:
    """GRPO against GRPO: both arms drawn from the same trajectory `mean_curve` `(K, 2)` with independent normal
    seed noise `sd` `(K, 2)`; the "method" arm is the checkpoint `checkpoint_index`. Returns the share of simulations
    with p < alpha (the per-comparison false-positive rate) and the share without a verdict."""
    rng = np.random.default_rng(seed)
    hits = none = 0
    for i in range(simulations):
        g = mean_curve[None] + rng.standard_normal((n_grpo, *mean_curve.shape)) * sd[None]
        m = mean_curve[checkpoint_index][None] + rng.standard_normal((n_method, 2)) * sd[checkpoint_index][None]
        r = test(g, m, resamples=resamples, seed=seed + 1 + i, correction=correction)
        if r["p"] is None:
            none += 1
        elif r["p"] < alpha:
            hits += 1
    return {"false_positive_rate": hits / simulations, "no_verdict_rate": none / simulations,
            "simulations": simulations, "resamples": resamples, "alpha": alpha, "correction": correction,
            "n_grpo": n_grpo, "n_method": n_method}


def empirical_null(runs: np.ndarray, checkpoint_index: int, resamples: int, seed: int,
                   correction: str = CORRECTION) -> dict[str, Any]:
    """Every split of GRPO's seeds `runs` `(seeds, K, 2)` into two halves (one the curve, the other the "method" at
    `checkpoint_index`): the share of splits with p < 0.05, the mean effect and how many had no verdict."""
    import itertools

    n = runs.shape[0]
    half = n // 2
    ps, effects = [], []
    for first in itertools.combinations(range(n), half):
        if 0 not in first:  # each unordered split once, with seed 0 in the curve's half
            continue
        rest = [i for i in range(n) if i not in first]
        r = test(runs[list(first)], runs[rest, checkpoint_index], resamples=resamples, seed=seed,
                 correction=correction)
        ps.append(r["p"])
        effects.append(r["effect"])
    known = [p for p in ps if p is not None]
    return {"splits": len(ps), "no_verdict": len(ps) - len(known),
            "share_p_below_0.05": (sum(p < 0.05 for p in known) / len(known)) if known else None,
            "mean_effect": float(np.mean([e for e in effects if e is not None])) if known else None}

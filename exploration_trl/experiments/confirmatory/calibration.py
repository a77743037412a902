"""Calibration and power of the confirmatory test (`verdict.test`) under a noise model fitted to GRPO's own seeds.

The noise model is the seeds' empirical joint distribution, to second order: a run is GRPO's seed-mean trajectory
plus Gaussian noise with the sample covariance of the seeds' `(pass@1, pass@n)` at every checkpoint, correlated
across checkpoints and between the two metrics (`fit_noise`). With S seeds the covariance has rank S - 1; sampling
`mean + residuals.T @ z / sqrt(S - 1)` with `z ~ N(0, I_S)` draws exactly from it (`NoiseModel.draw`).

* `null_rate`: GRPO against GRPO (the method arm drawn from the same model at the compared checkpoint): the share of
  simulations with p < alpha, with its Monte Carlo standard error and a 95% Wilson interval. The test is calibrated
  when that interval's upper end is at most alpha.
* `power`: a method whose seed mean sits `effect` above GRPO's trajectory in pass@n at GRPO's pass@1 of the compared
  checkpoint, with the seed noise of `method_noise` (default GRPO's at that checkpoint): the share of simulations in
  which Holm's first step rejects (p * m < alpha, the hypothesis alone among m: the least powerful case).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import verdict


@dataclass(frozen=True)
class NoiseModel:
    mean: np.ndarray  # (K, 2): seed-mean (pass@1, pass@n) per checkpoint
    residuals: np.ndarray  # (S, K * 2): each seed's deviation from the mean

    @property
    def seeds(self) -> int:
        return self.residuals.shape[0]

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`(n, K, 2)` simulated runs."""
        z = rng.standard_normal((n, self.seeds))
        noise = z @ self.residuals / math.sqrt(max(self.seeds - 1, 1))
        return self.mean[None] + noise.reshape(n, *self.mean.shape)

    def at(self, index: int) -> NoiseModel:
        """The model of one checkpoint, `(1, 2)`."""
        if not 0 <= index < self.mean.shape[0]:
            raise IndexError(f"checkpoint index {index} is outside the model's {self.mean.shape[0]} checkpoints")
        return NoiseModel(self.mean[index:index + 1], self.residuals[:, [2 * index, 2 * index + 1]])


def fit_noise(runs: np.ndarray) -> NoiseModel:
    """The noise model of GRPO's runs `(S, K, 2)`."""
    runs = np.asarray(runs, float)
    mean = runs.mean(axis=0)
    return NoiseModel(mean, (runs - mean[None]).reshape(runs.shape[0], -1))


def wilson(hits: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95% Wilson score interval of a binomial share."""
    if n == 0:
        return 0.0, 1.0
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _rate(hits: int, none: int, sims: int) -> dict[str, Any]:
    share = hits / sims
    lo, hi = wilson(hits, sims)
    return {"rate": share, "mc_se": math.sqrt(share * (1 - share) / sims), "ci95": [lo, hi], "simulations": sims,
            "no_verdict": none}


def null_rate(noise: NoiseModel, checkpoint_index: int, n_grpo: int, n_method: int, simulations: int = 10_000,
              resamples: int = 2000, seed: int = 0, correction: str = verdict.CORRECTION,
              alpha: float = 0.05, estimator: str = verdict.ESTIMATOR, spread: float = 1.0) -> dict[str, Any]:
    """GRPO against GRPO under `noise` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    point = noise.at(checkpoint_index)
    hits = none = 0
    for i in range(simulations):
        grpo = noise.draw(rng, n_grpo)
        method = point.draw(rng, n_method)[:, 0]
        p = verdict.test(grpo, method, resamples=resamples, seed=seed + 1 + i, correction=correction,
                         estimator=estimator, spread=spread)["p"]
        if p is None:
            none += 1
        elif p < alpha:
            hits += 1
    return {**_rate(hits, none, simulations), "alpha": alpha, "n_grpo": n_grpo, "n_method": n_method,
            "resamples": resamples, "correction": correction, "estimator": estimator, "spread": spread,
            "noise_seeds": noise.seeds}


def power(noise: NoiseModel, checkpoint_index: int, n_grpo: int, n_method: int, effect: float, tests: int,
          method_noise: NoiseModel | None = None, simulations: int = 2000, resamples: int = 4000, seed: int = 0,
          correction: str = verdict.CORRECTION, alpha: float = 0.05,
          estimator: str = verdict.ESTIMATOR, spread: float = 1.0) -> dict[str, Any]:
    """The share of simulations in which a method `effect` above GRPO's trajectory (pass@n at GRPO's pass@1 of the
    checkpoint) is rejected at Holm's first step among `tests` hypotheses (p < alpha / tests)."""
    rng = np.random.default_rng(seed)
    point = method_noise or noise.at(checkpoint_index)
    centre = noise.mean[checkpoint_index] + np.array([0.0, effect])
    hits = none = 0
    for i in range(simulations):
        grpo = noise.draw(rng, n_grpo)
        method = point.draw(rng, n_method)[:, 0] - point.mean[0] + centre
        p = verdict.test(grpo, method, resamples=resamples, seed=seed + 1 + i, correction=correction,
                         estimator=estimator, spread=spread)["p"]
        if p is None:
            none += 1
        elif p < alpha / tests:
            hits += 1
    return {**_rate(hits, none, simulations), "effect": effect, "tests": tests, "alpha": alpha, "n_grpo": n_grpo,
            "n_method": n_method, "resamples": resamples, "correction": correction, "estimator": estimator,
            "spread": spread}


def pooled_method_noise(arms: list[np.ndarray]) -> NoiseModel:
    """One checkpoint's `(pass@1, pass@n)` noise pooled over several settings' seeds (each arm `(S_a, 2)` centred on
    its own mean): the within-setting seed noise of methods, for `power`."""
    residuals = np.concatenate([np.asarray(a, float) - np.asarray(a, float).mean(axis=0) for a in arms])
    dof = sum(len(a) - 1 for a in arms)
    # Scaled so that `draw`'s divisor (rows - 1) gives the pooled covariance (sum of squares / dof).
    scale = math.sqrt((residuals.shape[0] - 1) / dof)
    return NoiseModel(np.zeros((1, 2)), residuals * scale)


def smoothed(noise: NoiseModel, steps: list[int], degree: int = 3) -> NoiseModel:
    """The same noise around a smooth mean trajectory: each metric's seed mean fitted by a polynomial of `degree` in
    log(1 + step) (least squares). A piecewise-linear curve through noisy seed means bends at every checkpoint; used as
    the truth of a simulation, those bends (mostly noise with a few seeds) put a bias into any reading of the curve
    at a noisy pass@1. The smooth truth is the model of a trajectory without such bends."""
    t = np.log1p(np.asarray(steps, float))
    basis = np.vander(t, degree + 1)
    coef, *_ = np.linalg.lstsq(basis, noise.mean, rcond=None)
    return NoiseModel(basis @ coef, noise.residuals)


# ------------------------------------------------------------------------------ the second protocol, before its runs
#: The first protocol's countdown3 GRPO seeds and steps, and its six method settings at 1,500 steps: the noise the
#: second protocol's pre-run calibration and power analysis used (`pre_run`).
V1_GRPO_SEEDS, V1_METHOD_SEEDS = list(range(10, 20)), list(range(10, 15))
V1_STEPS = [0, 100, 200, 400, 700, 1000, 1500, 2000, 2500]
V1_METHODS = ["pkpo_k4", "passk_k4", "progrpo_published", "dsgrpo_published", "casp_published", "kl_cov_published"]


def pre_run(records_dir: str, n_grpo: int = 36, n_method: int = 18, tests: int = 12, spread: float = 1.1,
            simulations: int = 10_000, power_simulations: int = 2000) -> dict[str, Any]:
    """The second protocol's calibration and power, from the first protocol's countdown3 records (`records_dir`:
    `confirmatory_state/countdown3`): the null rate of the registered test (mean point, `spread`) at steps 400, 700 and
    1,000 under the raw and the smoothed noise model, 0.7.0's test (per seed, no spread) at 700 and 1,000 for
    comparison, and the power against +3 points at GRPO's 1,000-step pass@1."""
    from . import runner

    records = runner.collect(records_dir)

    def points(label, seed, steps):
        by = {r["step"]: (r["pass@1"], r["pass@n"]) for r in records[(label, seed)]["rows"]}
        return np.array([by[s] for s in steps], float)

    grpo = np.stack([points("grpo", s, V1_STEPS) for s in V1_GRPO_SEEDS])
    raw = fit_noise(grpo)
    models = {"raw": raw, "smooth": smoothed(raw, V1_STEPS)}
    out: dict[str, Any] = {"noise": f"{records_dir}: GRPO seeds {V1_GRPO_SEEDS}, steps {V1_STEPS}",
                           "n_grpo": n_grpo, "n_method": n_method, "null": {}}
    for name, model in models.items():
        for step in (400, 700, 1000):
            out["null"][f"{name}_{step}"] = null_rate(model, V1_STEPS.index(step), n_grpo, n_method, simulations,
                                                      2000, seed=2026, estimator="mean_point", spread=spread)
    for step in (700, 1000):
        out["null"][f"raw_{step}_per_seed_no_spread"] = null_rate(raw, V1_STEPS.index(step), n_grpo, n_method,
                                                                  simulations, 2000, seed=2027)
    arms = [np.stack([points(m, s, [1500])[0] for s in V1_METHOD_SEEDS]) for m in V1_METHODS]
    out["power"] = power(raw, V1_STEPS.index(1000), n_grpo, n_method, 0.03, tests, pooled_method_noise(arms),
                         power_simulations, 4000, seed=7, estimator="mean_point", spread=spread)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m exploration_trl.experiments.confirmatory.calibration confirmatory_state/countdown3 OUT.json`."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="The second protocol's pre-run calibration and power.")
    parser.add_argument("records", help="the first protocol's countdown3 folder (confirmatory_state/countdown3)")
    parser.add_argument("output", help="where to write the JSON")
    args = parser.parse_args(argv)
    with open(args.output, "w") as f:
        json.dump(pre_run(args.records), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""When does a method beat GRPO over a training budget? The rule, fixed in code before the budget experiment ran.

GRPO's checkpoints trace a trajectory in the (pass@1, pass@64) plane: pass@1 rises and pass@64 falls as training
sharpens the policy. A method that trades pass@1 for pass@64 has not beaten GRPO unless it lies above the point
GRPO stopped early reaches at the same pass@1. So:

* **Baseline trajectory.** The baseline's mean (over RL seeds) pass@1 and pass@64 at each evaluated step, joined in
  step order by straight segments. At a pass@1 value `x` its pass@64 is the highest value of any segment that spans
  `x` (the best early-stopped baseline at that accuracy); its standard error is interpolated with the same weights
  from the seed standard errors of the segment's two end points. Outside the trajectory's pass@1 range there is no
  comparison (no extrapolation).
* **Beats.** A method beats the baseline when, at some evaluated step after step 0, its mean pass@64 exceeds the
  baseline's trajectory at the method's mean pass@1 by more than `MARGIN_SE` (2) combined standard errors,
  `sqrt(se_method^2 + se_baseline^2)`, each the seed standard deviation over `sqrt(seeds)`. Fewer than 2 seeds
  give no standard error and no verdict.
* **Below.** Symmetrically, a method is below the baseline when at its last evaluated step its pass@64 is more
  than `MARGIN_SE` combined standard errors under the trajectory.
* **Against the entropy bonus.** The same rule with the entropy bonus as baseline: at each pass@1 the highest of
  its coefficients' trajectories (the best entropy bonus at that accuracy).

`verdict` returns the numbers behind the word, so a report can show how close a "no" was.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["MARGIN_SE", "Point", "baseline_at", "mean_se", "trajectory", "verdict"]

#: Standard errors the method's pass@64 must clear above the baseline's trajectory (fixed before the runs).
MARGIN_SE = 2.0

#: `(step, pass@1 mean, pass@64 mean, pass@64 standard error or None, seeds)` of one evaluated checkpoint.
Point = tuple[int, float, float, "float | None", int]


def mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error (sample std / sqrt(n)); the error is None for fewer than 2 values."""
    vals = [float(v) for v in values]
    m = sum(vals) / len(vals)
    if len(vals) < 2:
        return m, None
    var = sum((v - m) ** 2 for v in vals) / (len(vals) - 1)
    return m, math.sqrt(var / len(vals))


def trajectory(rows: Iterable[Mapping[str, Any]]) -> list[Point]:
    """One method-setting's checkpoints averaged over seeds: rows with `step`, `seed`, `pass@1`, `pass@64`."""
    by_step: dict[int, list[Mapping]] = defaultdict(list)
    for r in rows:
        by_step[int(r["step"])].append(r)
    points = []
    for step in sorted(by_step):
        group = by_step[step]
        p1, _ = mean_se([r["pass@1"] for r in group])
        p64, se = mean_se([r["pass@64"] for r in group])
        points.append((step, p1, p64, se, len(group)))
    return points


def baseline_at(x: float, baselines: Sequence[Sequence[Point]]) -> tuple[float, float | None] | None:
    """`(pass@64, standard error)` of the baselines' upper envelope at pass@1 `x`, or None when no segment (or
    single point) of any baseline trajectory spans `x`."""
    best: tuple[float, float | None] | None = None
    for traj in baselines:
        segments = list(zip(traj, traj[1:])) or [(traj[0], traj[0])] if traj else []  # noqa: RUF007
        for a, b in segments:
            lo, hi = min(a[1], b[1]), max(a[1], b[1])
            if not lo <= x <= hi:
                continue
            w = 0.0 if hi == lo else (x - a[1]) / (b[1] - a[1])
            value = a[2] + w * (b[2] - a[2])
            se = None if a[3] is None or b[3] is None else a[3] + w * (b[3] - a[3])
            if best is None or value > best[0]:
                best = (value, se)
    return best


def verdict(method: Sequence[Point], baselines: Sequence[Sequence[Point]],
            margin_se: float = MARGIN_SE) -> dict[str, Any]:
    """`{"verdict": "beats" | "below" | "no" | "no verdict", "best": {...}, "last": {...}, "compared": n}` of one
    method's trajectory against the baselines' (see the module docstring). `best` is the checkpoint with the largest
    margin in standard errors; `last` is the last compared checkpoint."""
    compared = []
    for step, p1, p64, se, seeds in method:
        if step == 0:
            continue
        base = baseline_at(p1, baselines)
        if base is None or se is None or base[1] is None:
            continue
        combined = math.sqrt(se ** 2 + base[1] ** 2)
        diff = p64 - base[0]
        z = math.inf if combined == 0 and diff > 0 else -math.inf if combined == 0 and diff < 0 else (
            0.0 if combined == 0 else diff / combined)
        compared.append({"step": step, "pass@1": p1, "pass@64": p64, "baseline_pass@64": base[0],
                         "difference": diff, "combined_se": combined, "z": z, "seeds": seeds})
    if not compared:
        return {"verdict": "no verdict", "best": None, "last": None, "compared": 0}
    best = max(compared, key=lambda c: c["z"])
    last = max(compared, key=lambda c: c["step"])
    if best["z"] > margin_se:
        word = "beats"
    elif last["z"] < -margin_se:
        word = "below"
    else:
        word = "no"
    return {"verdict": word, "best": best, "last": last, "compared": len(compared)}

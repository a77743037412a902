"""The second protocol's power below its +3-point design effect, with the registered power code
(`calibration.power`, the pre-run noise model of `calibration.pre_run`: 0.7.0's countdown3 GRPO seeds, the six method
settings' pooled seed noise, 36 GRPO and 18 method seeds, Holm's first step among 12 tests, `mean_point`, spread 1.1).
A "not shown" verdict for an arm whose true effect is below 3 points says little; this puts a number on how little.

    python -m exploration_trl.experiments.confirmatory.power_curve confirmatory_state/countdown3 OUT.json
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import _common
from . import calibration as cal
from . import runner

EFFECTS = (0.015, 0.02, 0.025, 0.03)


def power_curve(records_dir: str, effects=EFFECTS, simulations: int = 1000, n_grpo: int = 36, n_method: int = 18,
                tests: int = 12, spread: float = 1.1) -> dict[str, Any]:
    records = runner.collect(records_dir)

    def points(label, seed, steps):
        by = {r["step"]: (r["pass@1"], r["pass@n"]) for r in records[(label, seed)]["rows"]}
        return np.array([by[s] for s in steps], float)

    raw = cal.fit_noise(np.stack([points("grpo", s, cal.V1_STEPS) for s in cal.V1_GRPO_SEEDS]))
    arms = [np.stack([points(m, s, [1500])[0] for s in cal.V1_METHOD_SEEDS]) for m in cal.V1_METHODS]
    rows = []
    for effect in effects:
        r = cal.power(raw, cal.V1_STEPS.index(1000), n_grpo, n_method, effect, tests, cal.pooled_method_noise(arms),
                      simulations, 4000, seed=7, estimator="mean_point", spread=spread)
        print(f"power at +{100 * effect:.1f} points: {r['rate']:.3f} (MC SE {r['mc_se']:.3f})", flush=True)
        rows.append(r)
    return {"noise": f"{records_dir}: as calibration.pre_run", "simulations": simulations, "curve": rows,
            "command": f"python -m exploration_trl.experiments.confirmatory.power_curve {records_dir} OUT.json"}


#: The markers in docs/confirmatory.md around the sentence this module's output fills.
BLOCK_START, BLOCK_END = "<!-- power-curve:start -->", "<!-- power-curve:end -->"


def with_registered(curve: list[dict[str, Any]], pre_run: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The curve, largest effect first, with the registered +3-point figure (`pre_run`, more simulations) in place
    of the curve's own point at that effect."""
    rows = [r for r in curve if pre_run is None or r["effect"] != pre_run["effect"]]
    return sorted(rows + ([pre_run] if pre_run else []), key=lambda r: -r["effect"])


def sentence(data: dict[str, Any], pre_run: dict[str, Any] | None) -> str:
    """The curve in words (`with_registered`)."""
    rows = with_registered(data["curve"], pre_run)
    shown = "; ".join(f"**{r['rate']:.2f}** [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] at +{100 * r['effect']:.1f} points "
                      f"({r['simulations']:,} simulations)" for r in rows)
    return (f"these probabilities that a method that far above GRPO's trajectory at the 1,000-step pass@1 gets \"beats "
            f"GRPO\" (Holm's first step among the 12 primary tests, 18 method and 36 GRPO seeds): {shown}.")


def main(argv: list[str] | None = None) -> int:
    return _common.records_to_json_command("exploration_trl.experiments.confirmatory.power_curve", power_curve, argv)


if __name__ == "__main__":
    sys.exit(main())

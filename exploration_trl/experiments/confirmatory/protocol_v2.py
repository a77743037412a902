"""The second pre-registered confirmatory protocol (issue 44): what runs, what is compared and how, fixed in its commit
before any of its runs. A `protocol_version: 2` YAML (`configs/confirmatory/countdown3_v2.yaml`); this module reads and
checks it, lays out its runs and holds the selection rule. The test itself is `verdict.test` with the YAML's
`bootstrap` options; the analysis `analysis_v2.py`.

Design decisions and why (the numbers: docs/confirmatory.md, "The second protocol"):

1. **Provenance.** Every run record stores the package version, the commit and a hash of the package source that
   ran (`provenance.py`); the analysis refuses records of mixed provenance unless the YAML declares the difference
   (`provenance: {declared: [...]}`). The runs are made from a `git archive` of the protocol commit, which writes the
   commit into `exploration_trl/_commit.py`.
2. **Data kept apart.** The held-out set is 0.7.0's (same salt and share: the same 500 problems in 87 number
   multisets, checksum recorded). A *selection* split of 300 problems from 41 other multisets (`selection`, salt
   `confirmatory-v2-selection`, 15% of the multisets) is neither trained on (SFT included: the warm start is retrained
   on what is left) nor used for any verdict; the tuned settings are chosen on it, with their own seeds (30-33).
3. **Per-problem records.** Every evaluation stores the correct count of each evaluated problem, so uncertainty over
   problems can be estimated (the secondary analysis bootstraps seeds and number multisets together).
4. **The estimand, and why it reads GRPO's curve once.** The effect is the method's seed-mean pass@n minus GRPO's
   piecewise-linear seed-mean trajectory read at the method's seed-mean pass@1 (`estimator: mean_point`). 0.7.0 read
   the curve at every seed's own pass@1 and averaged (`per_seed`). A piecewise-linear curve bends at each of GRPO's
   checkpoints; averaging it over pass@1 values scattered around a bend is biased by about the change of slope times
   the scatter / sqrt(2 pi). GRPO against GRPO compares at one of GRPO's checkpoints, on a bend by construction: with
   a noise model fitted to 0.7.0's ten GRPO seeds the per-seed form's null false-positive rate was 10.1% at step 700
   and 0.25% at 1,000 (10,000 simulations, 36 GRPO and 18 method seeds). Read at the mean pass@1, the scatter is the
   mean's (divided by sqrt(n)). `effect_per_seed`, 0.7.0's reading, is reported beside.
5. **A calibrated test.** The seed bootstrap of both arms with each seed's deviation scaled by sqrt(n/(n-1)) times
   t_{min(n)-1}/z (0.7.0's `inflate_t`), and once more by `spread: 1.1`, chosen on the null before any run: under the
   noise model of 0.7.0's GRPO seeds (their covariance across checkpoints and metrics, with the raw seed-mean
   trajectory or a smoothed one as the truth, `calibration.smoothed`), `mean_point` without the extra spread gave
   5.16% [4.74, 5.61] at step 400 (smooth truth, 28 and 14 seeds): above the 5% bar. The registered test gave 3.91%
   [3.55, 4.31], 4.27% [3.89, 4.68] and 1.18% [0.99, 1.41] at steps 400, 700 and 1,000 (raw truth), 3.69%, 3.46%
   and 3.01% (smooth truth); 95% Wilson intervals of 10,000 simulations each
   (`confirmatory_state/countdown3_v2/pre_run_calibration.json`, `calibration.pre_run`).
6. **Power and budget.** With 0.7.0's seed noise (GRPO's for GRPO, the six method settings' pooled for the method), a
   method 3 points of pass@64 above GRPO's trajectory at its 1,000-step position, 18 method seeds and 36 GRPO seeds
   (all of them the reference curve) is detected at Holm's first step among 12 tests with probability 0.84 [0.82,
   0.85] (2,000 simulations); 16 and 32 seeds: 0.78. The compared checkpoints are 500 and 1,000 steps, GRPO runs to
   2,500: in 0.7.0, GRPO's seed-mean pass@1 rose from 0.317 (1,000) to 0.350 (2,500), so a method at its 1,000-step
   pass@1 sits well inside GRPO's range (at 1,500, most of the power was lost to seeds beyond GRPO's last pass@1).
7. **The settings, each at 18 seeds (100-117; GRPO 100-135), one Holm family of their 12 primary tests:**
   - `grpo_lr_half`, the negative control: GRPO with only its learning rate halved (5e-5), compared at 1,000 and 2,000
     steps (the same learning-rate-weighted budget). The expectation is that it does not beat GRPO; if it does, the
     estimand is confounded with step size and every verdict is read in that light.
   - The four seed methods *tuned*: ProGRPO (alpha), DS-GRPO (gamma_p = gamma_n), CaSP (alpha), KL-Cov (ratio), each
     on a grid of the paper's value and 10x and 100x it (the toy's steps are small). Rule, fixed here: on the selection
     split, with 3 seeds per grid value and 4 GRPO seeds to 2,500 steps, each value's mean-point effect at step 1,000
     against those GRPO seeds' curve; the largest wins; a value whose seeds' mean pass@1 is outside that curve's range
     cannot win; ties go to the value listed first (the paper's); with no eligible value, the paper's. The chosen
     setting then runs on the confirmation seeds and the held-out set.
   - The five methods added in 0.8.0 at their papers' defaults: maxrl, wreinforce, qae, entropy_adv, outcome_explore.
   - The replication: PKPO k = 4 and Pass@k Training k = 4 on fresh seeds (0.7.0 found both beat GRPO).
8. **Nulls reported after the runs:** the simulation above with this set-up's own GRPO seeds (10,000 simulations, Monte
   Carlo error and Wilson interval), and the empirical null over directed splits of its 36 GRPO seeds into two halves
   of 18 (a uniform sample of 10,000 of the C(36, 18) directed splits: all of them would take days).
9. **Compute**, measured on 0.7.0's runs (one core each, idle): GRPO to 2,500 steps ~500 s, a setting's 1,000 steps
   ~190 s, the control's 2,000 ~350 s, the warm start's SFT ~300 s: 36 GRPO + 18 control + 11 x 18 settings + 40
   selection runs = about 20 core-hours, 10 hours with two runs at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROLES = ("negative_control", "tuned", "new", "replication")


def is_v2(cfg: dict[str, Any]) -> bool:
    return int(cfg.get("protocol_version", 1)) >= 2


def check(cfg: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """One-line errors for the keys the second protocol adds; returns `cfg`."""
    sel = cfg.get("selection")
    tuned = [s for s in cfg["settings"] if s.get("role") == "tuned"]
    if tuned and not sel:
        raise ValueError(f"--config {path}: settings {[s['label'] for s in tuned]} are tuned but there is no "
                         "`selection` split")
    if sel:
        for key in ("salt", "share", "num_problems", "checkpoint", "grpo_seeds", "grpo_steps", "seeds", "steps"):
            if key not in sel:
                raise ValueError(f"--config {path}: selection has no '{key}'")
        if sel["checkpoint"] not in sel["steps"] or sel["checkpoint"] not in sel["grpo_steps"]:
            raise ValueError(f"--config {path}: selection checkpoint {sel['checkpoint']} must be one of its steps")
    for s in cfg["settings"]:
        if s.get("role", "baseline" if s["label"] == cfg["baseline"] else None) not in (*ROLES, "baseline"):
            raise ValueError(f"--config {path}: setting {s['label']!r} has role {s.get('role')!r}; choose one of "
                             f"{', '.join(ROLES)}")
        if s.get("role") == "tuned" and not s.get("grid"):
            raise ValueError(f"--config {path}: tuned setting {s['label']!r} has no grid")
        own = s.get("checkpoints")
        if own and not set(own) <= set(s["steps"]):
            raise ValueError(f"--config {path}: setting {s['label']!r} checkpoints {own} are not all among its steps")
    return cfg


def quick(cfg: dict[str, Any], first: dict[str, Any]) -> dict[str, Any]:
    """A minutes-long smoke version of a second-protocol set-up: tiny data, model, budgets and evaluation; GRPO, the
    control, one tuned setting with a grid of two and one new method, 2 seeds each (3 for GRPO). `first`: what the
    first protocol's `quick` makes of `cfg` (data, model, SFT and evaluation sizes)."""
    import copy

    q = dict(first)
    q["protocol_version"] = 2
    q["selection"] = {**cfg["selection"], "num_problems": 6, "checkpoint": 4, "grpo_seeds": [30, 31],
                      "grpo_steps": [0, 2, 4, 6], "seeds": [30], "steps": [0, 4]}
    q["bootstrap"] = {**cfg["bootstrap"], "resamples": 200}
    q["secondary"] = {"seeds_and_multisets": {"resamples": 50, "seed": 1}}
    q["null"] = {"simulations": 20, "resamples": 50, "seed": 1, "splits": 4}
    keep = {"baseline": None, "negative_control": None, "tuned": None, "new": None}
    settings = []
    for s in cfg["settings"]:
        role = "baseline" if s["label"] == cfg["baseline"] else s.get("role")
        if role not in keep or keep[role] is not None:
            continue
        keep[role] = s["label"]
        t = copy.deepcopy(s)
        t["seeds"] = s["seeds"][:3] if role == "baseline" else s["seeds"][:2]
        t["steps"] = [0, 1, 2, 3, 4, 6] if role == "baseline" else [0, 2, 4]
        if role == "negative_control":
            t["checkpoints"], t["steps"] = [2, 4], [0, 2, 4]
        if role == "tuned":
            t["grid"] = s["grid"][:2]
        settings.append(t)
    q["settings"] = settings
    return q


def checkpoints_of(cfg: dict[str, Any], setting: dict[str, Any]) -> list[int]:
    """A setting's compared checkpoints, the last one primary."""
    return sorted(setting.get("checkpoints") or cfg["checkpoints"])


def grid_label(value: dict[str, Any]) -> str:
    """`progrpo_alpha=3.0` (several keys joined by `,`): how a grid value is named in records and reports."""
    return ",".join(f"{k}={v}" for k, v in value.items())


# ------------------------------------------------------------------------------------------------ the runs
def selection_jobs(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The selection phase's runs: GRPO's selection seeds, then every grid value of every tuned setting."""
    sel, base = cfg["selection"], _setting(cfg, cfg["baseline"])
    jobs = [{"phase": "selection", "label": base["label"], "method": base["method"],
             "overrides": dict(base.get("overrides") or {}), "seed": sd, "steps": sel["grpo_steps"]}
            for sd in sel["grpo_seeds"]]
    for s in cfg["settings"]:
        if s.get("role") != "tuned":
            continue
        for value in s["grid"]:
            for sd in sel["seeds"]:
                jobs.append({"phase": "selection", "label": f"{s['label']}@{grid_label(value)}", "setting": s["label"],
                             "method": s["method"], "overrides": {**(s.get("published") or {}), **value},
                             "seed": sd, "steps": sel["steps"]})
    return jobs


#: Run order of the confirmation, by the issue's priority (were the budget to run out, whole settings of the last
#: groups would be missing, never seeds of the first): GRPO and the control, the tuned settings, the new methods, the
#: replication. Within a group the settings take turns, seed by seed.
PRIORITY = (("baseline", "negative_control"), ("tuned",), ("new",), ("replication",))


def confirm_jobs(cfg: dict[str, Any], chosen: dict[str, dict] | None) -> list[dict[str, Any]]:
    """The confirmation runs in run order (`PRIORITY`). A tuned setting's overrides are its published ones with the
    selection's value (`chosen`: label -> value); without it, its jobs have `overrides` None (not yet runnable)."""
    def role(s):
        return "baseline" if s["label"] == cfg["baseline"] else s.get("role")

    def job(s, sd):
        overrides = dict(s.get("overrides") or {})
        if s.get("role") == "tuned":
            overrides = None if chosen is None or s["label"] not in chosen else {
                **(s.get("published") or {}), **chosen[s["label"]]}
        return {"phase": "confirm", "label": s["label"], "method": s["method"], "overrides": overrides, "seed": sd,
                "steps": s["steps"]}

    order = []
    for roles in PRIORITY:
        group = [s for s in cfg["settings"] if role(s) in roles]
        for i in range(max((len(s["seeds"]) for s in group), default=0)):
            order += [job(s, s["seeds"][i]) for s in group if i < len(s["seeds"])]
    return order


def _setting(cfg: dict[str, Any], label: str) -> dict[str, Any]:
    return next(s for s in cfg["settings"] if s["label"] == label)


# -------------------------------------------------------------------------------------- the selection rule
def choose(cfg: dict[str, Any], records: dict[tuple[str, int], dict]) -> dict[str, Any]:
    """The selection (design decision 7): per tuned setting, each grid value's mean-point effect at the selection
    checkpoint against the selection GRPO seeds' curve, and the chosen value. `records`: the selection runs,
    `{(label, seed): record}`."""
    import numpy as np

    from . import verdict

    sel, base = cfg["selection"], _setting(cfg, cfg["baseline"])
    steps, at = sorted(sel["grpo_steps"]), int(sel["checkpoint"])
    grpo = np.stack([_points(records[(base["label"], sd)], steps) for sd in sel["grpo_seeds"]])
    out: dict[str, Any] = {"checkpoint": at, "grpo_seeds": sel["grpo_seeds"], "seeds": sel["seeds"], "settings": {}}
    for s in cfg["settings"]:
        if s.get("role") != "tuned":
            continue
        values = []
        for value in s["grid"]:
            label = f"{s['label']}@{grid_label(value)}"
            m = np.stack([_points(records[(label, sd)], [at])[0] for sd in sel["seeds"]])
            effect = verdict.point_effect(grpo, m)
            values.append({"value": value, "label": grid_label(value), "effect": None if np.isnan(effect) else effect,
                           "mean": m.mean(axis=0).tolist()})
        eligible = [v for v in values if v["effect"] is not None]
        best = max(eligible, key=lambda v: v["effect"]) if eligible else values[0]  # max keeps the first of ties
        out["settings"][s["label"]] = {"grid": values, "chosen": best["value"], "chosen_label": best["label"],
                                       "reason": "largest effect" if eligible else "no eligible value: the paper's"}
    return out


def _points(rec: dict, steps: list[int]):
    import numpy as np

    by = {r["step"]: (r["pass@1"], r["pass@n"]) for r in rec["rows"]}
    return np.array([by[s] for s in steps], float)

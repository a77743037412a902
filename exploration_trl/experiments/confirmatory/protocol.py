"""The pre-registered confirmatory protocols: what runs, what is compared and how, each fixed in its commit before
any of its runs (docs/math.md, "The confirmatory verdict"; docs/confirmatory.md). One YAML per set-up
(`configs/confirmatory/<setup>.yaml`); `load` reads and checks it, `quick` shrinks it to a smoke run, and the rest
lays out a set-up's runs and holds the second protocol's selection rule. What the YAML asks for decides what runs and
what the analysis computes (`analysis.py`): a `selection` split and `role`s, a `holm: primary` family, a `secondary`
analysis, a `null` section. The test itself is `verdict.test` with the YAML's `bootstrap` options.

## The first protocol (0.7.0; issue 37; pre-registered in 9357c88)

A protocol is a YAML (`configs/confirmatory/<setup>.yaml`) of settings, seeds, steps, the compared checkpoints and
the evaluation set; `load` reads and checks it. Two forms:

* `task: countdown`: the built-in Countdown set-ups (a fresh held-out split, a warm start retrained on the rest,
  every (setting, seed) RL run from it, evaluated as it trains: `runner.py`).
* `task: train`: any model and task, through the existing `exploration-trl train` pipeline, once per (setting,
  seed), from a training YAML (`train_config`) that sets the held-out evaluation keys (`eval_benchmark`, `eval_n`,
  `eval_ks`; `trainers/heldout_eval.py`); eval_pass@1 and eval_pass@<eval_n> are read from the log history.

Design decisions and why:

1. **Held-out set: whole multisets.** A multiset of numbers is held out when `sha256("confirmatory-v1:<sorted
   numbers>")` falls in the lowest `share` = 25% (`heldout.py`); all its reachable targets are held-out problems,
   none of them (under any target) is in training. 25% of the 364 triples of 1..12 hold 88 multisets and 1,172
   problems, so the 500 evaluated problems are drawn from 87 multisets. The exploratory set shared 198 of 200
   triples with training.
2. **Fresh warm start.** Each set-up's warm start is retrained on the remaining problems with the shipped warm
   start's SFT recipe (countdown-tiny's SFT settings, seed 0) and exported to `<output>/warm_start`; its checksum is
   recorded in the results. The held-out set is used for no choice: the checkpoints are named here.
3. **Evaluation seeds independent of RL seeds.** The held-out sampler is seeded by `eval.seed` (the trainer's
   `eval_seed`) and the problem only: the same random numbers for every run and checkpoint (common random numbers
   across checkpoints and runs); step 0 is therefore the same for every run.
4. **Set-up 1, countdown3** (the demo's 105,792-parameter char-level model, 3 numbers 1..12, targets to 100):
   GRPO; PKPO k=4; Pass@k Training k=4; ProGRPO, DS-GRPO (`sequence_sum`), CaSP and KL-Cov at their papers'
   published settings (`frontier.PUBLISHED`, `curves.SETTINGS`' `_published` labels). RL seeds 10-14 for every
   setting (none of 0, 1, 2, the exploratory seeds); GRPO also runs null seeds 15-19 (the empirical GRPO-vs-GRPO
   null). The other settings' budget is the exploratory 1,500 steps, evaluated at 0, 700 and 1,500.
   **GRPO runs to 2,500 steps** (evaluated at 0, 100, 200, 400, 700, 1000, 1500, 2000, 2500): the curve is never
   extrapolated, and in the exploratory runs GRPO's seed-mean pass@1 at 1,500 (0.363) was below several methods'
   seeds at 1,500 (ProGRPO, DS-GRPO, CaSP, KL-Cov reached 0.36-0.37), so a 1,500-step GRPO curve would leave them,
   and half of the GRPO null seeds at 1,500, without a verdict by construction.
5. **Hypotheses**: (setting, checkpoint) for the 6 non-GRPO settings x {700, 1500}; Holm over all 12 of a set-up.
   Per setting: effect, 95% CI, p, p_holm at each checkpoint; the setting's top-level fields are those of the final
   checkpoint 1,500 (primary), the middle one nested.
6. **The test** (`verdict.py`): seed-level bootstrap of both arms (10,000 resamples, seed 271828), `f_GRPO` rebuilt
   each time, one-sided p = share of resampled effects <= 0, a resample with a method seed outside the rebuilt
   curve counts as <= 0; a setting with a seed outside GRPO's range on the real data has no verdict.
   **Calibration before the runs** (`null_simulation`, GRPO's exploratory seed-mean trajectory from
   docs/curves.json with its per-checkpoint seed SD; step 0 noiseless by the common random numbers; 2,000 and 2,500
   extrapolated linearly from 1,000-1,500 with the mean SD; 5 + 5 seeds; 2,000 simulations x 2,000 resamples;
   per-comparison rate of p < 0.05): plain percentile bootstrap 0.0215 at 700 and **0.0935** at 1,500; deviations
   inflated by sqrt(n/(n-1)) 0.0155 / **0.072**; inflated and scaled by t_{8}/z 0.010 / 0.0495 (at the bar);
   inflated and scaled by t_{min(n)-1 = 4}/z (Welch's conservative degrees of freedom) **0.0045 / 0.0335**: the
   pre-registered correction (`inflate_t`). After the runs the same simulation uses each set-up's measured GRPO
   noise, and the empirical null (GRPO seeds 15-19 against 10-14, and every 5/5 split of the 10 GRPO seeds) is
   reported too.
7. **Set-up 2, countdown4**: Countdown with 4 numbers 1..10 (1..12 would take 3 minutes of enumeration per process
   for little gain), targets to 100; a 4-layer, hidden-160 char-level model of 1,172,000 parameters (11.1x the
   demo's 105,792); its own held-out split (same salt and share) and warm start. Settings GRPO, PKPO k=4 and
   KL-Cov at 0.02/1 (`kl_cov_best`: the seed method closest to beating GRPO in the exploratory budget curves,
   docs/curves.json; this choice uses only exploratory data). Seeds 10-14 (GRPO null seeds 15-19 as in set-up 1).
   Budget from a timing measurement (6 RL steps per method, 16 prompts x 8 completions, 24-token completions of an
   untrained model of this size, one torch thread, the 2-core machine at load ~5): GRPO 1.69 s/step, PKPO 0.89,
   KL-Cov 1.46; SFT 1.07 s/step (3,000 steps: ~55 min). So the budget is 800 steps (checkpoints 400 and 800),
   GRPO runs to 1,300 (evaluated at 0, 100, 200, 400, 600, 800, 1000, 1300, to cover the methods' pass@1 at 800):
   about 11 CPU-hours for the 20 GRPO + 10 + 10 runs.
8. **Resumable runs**: each (setup, setting, seed) writes its record after every evaluation and saves a trainer
   checkpoint at every evaluation step (the last one kept); a restarted run resumes from it with the exact resume
   support of `trainers/resume.py`, so it equals the uninterrupted run (`tests/test_confirmatory.py`).
9. **Canonical distinct-correct**: equations equal up to commutativity and associativity of + and * count once
   (`rewards.countdown.canonical_equation`); both counts are reported.

## The second protocol (0.9.0; issue 44; `protocol_version: 2`, pre-registered in 4e6b608)

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

TASKS = ("countdown", "train")
SECTIONS = ("heldout", "data", "model", "sft", "rl", "eval", "bootstrap")
#: The exploratory GRPO noise the pre-run null simulation used (docs/curves.json), and its results.
PRE_RUN_NULL = {"inflate_t": {"700": 0.0045, "1500": 0.0335}, "inflate": {"700": 0.0155, "1500": 0.072},
                "none": {"700": 0.0215, "1500": 0.0935}}


def load(path: str | Path) -> dict[str, Any]:
    """The protocol YAML as a dict, checked: one-line errors naming the bad key."""
    import yaml

    cfg = yaml.safe_load(Path(path).read_text())
    if not isinstance(cfg, dict):
        raise ValueError(f"--config {path}: not a YAML mapping")  # noqa: TRY004 - a user error: one line, exit 2
    for key in ("name", "task", "settings", "checkpoints", "baseline"):
        if key not in cfg:
            raise ValueError(f"--config {path}: missing key '{key}'")
    if cfg["task"] not in TASKS:
        raise ValueError(f"--config {path}: task is {cfg['task']!r} but must be one of {TASKS}")
    labels = [s.get("label") for s in cfg["settings"]]
    if cfg["baseline"] not in labels:
        raise ValueError(f"--config {path}: baseline {cfg['baseline']!r} is not a settings label")
    base = setting(cfg, cfg["baseline"])
    for s in cfg["settings"]:
        for key in ("label", "method", "seeds", "steps"):
            if key not in s:
                raise ValueError(f"--config {path}: setting {s.get('label')!r} has no '{key}'")
        compared = s.get("checkpoints") or cfg["checkpoints"]
        if s is not base and not set(compared) <= set(s["steps"]):
            raise ValueError(f"--config {path}: setting {s['label']!r} steps {s['steps']} miss a checkpoint "
                             f"of {compared}")
        if {0, 1, 2} & set(s["seeds"]) | {0, 1, 2} & set(s.get("null_seeds", [])):
            raise ValueError(f"--config {path}: setting {s['label']!r} uses an exploratory seed (0, 1, 2)")
    if None in cfg:  # YAML reads the key `null:` as None: the second protocol's null section
        cfg["null"] = cfg.pop(None)
    cfg.setdefault("bootstrap", {"resamples": 10000, "seed": 271828, "correction": "inflate_t"})
    cfg.setdefault("alpha", 0.05)
    return check_second(cfg, path) if is_v2(cfg) else cfg


def quick(cfg: dict[str, Any]) -> dict[str, Any]:
    """A minutes-long smoke version of a countdown protocol: tiny data, model, budgets and evaluation, 2 seeds (a
    second-protocol set-up keeps one setting of each role, `_quick_second`)."""
    first = _quick_first(cfg)
    return _quick_second(cfg, first) if is_v2(cfg) else first


def _quick_first(cfg: dict[str, Any]) -> dict[str, Any]:
    import copy

    q = copy.deepcopy(cfg)
    q["name"] = cfg["name"] + "_quick"
    q["heldout"] = {**cfg.get("heldout", {}), "num_problems": 8}
    q["data"] = {**cfg.get("data", {}), "num_train": 64}
    q["model"] = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "intermediate_size": 64}
    q["sft"] = {**cfg.get("sft", {}), "steps": 20, "batch_size": 16, "warmup_steps": 2}
    q["rl"] = {**cfg.get("rl", {}), "prompts_per_step": 2, "num_generations": 4}
    q["eval"] = {**cfg.get("eval", {}), "n_samples": 4, "batch_size": 64}
    q["checkpoints"] = [2, 4]
    q["bootstrap"] = {**cfg.get("bootstrap", {}), "resamples": 200}
    keep = [cfg["baseline"]] + [s["label"] for s in cfg["settings"] if s["label"] != cfg["baseline"]][:1]
    q["settings"] = []
    for s in cfg["settings"]:
        if s["label"] in keep:
            base = s["label"] == cfg["baseline"]
            q["settings"].append({**s, "seeds": s["seeds"][:2], "null_seeds": s.get("null_seeds", [])[:0],
                                  "steps": [0, 1, 2, 3, 4, 6] if base else [0, 2, 4]})
    return q

ROLES = ("negative_control", "tuned", "new", "replication")


def is_v2(cfg: dict[str, Any]) -> bool:
    return int(cfg.get("protocol_version", 1)) >= 2


def check_second(cfg: dict[str, Any], path: str | Path) -> dict[str, Any]:
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


def _quick_second(cfg: dict[str, Any], first: dict[str, Any]) -> dict[str, Any]:
    """GRPO, the control, one tuned setting with a grid of two and one new method, 2 seeds each (3 for GRPO). `first`:
    what `_quick_first` makes of `cfg` (data, model, SFT and evaluation sizes)."""
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
    sel, base = cfg["selection"], setting(cfg, cfg["baseline"])
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


def setting(cfg: dict[str, Any], label: str) -> dict[str, Any]:
    """The setting of `cfg` labelled `label` (`cfg["baseline"]`: the reference arm)."""
    return next(s for s in cfg["settings"] if s["label"] == label)


# -------------------------------------------------------------------------------------- the selection rule
def choose(cfg: dict[str, Any], records: dict[tuple[str, int], dict]) -> dict[str, Any]:
    """The selection (design decision 7): per tuned setting, each grid value's mean-point effect at the selection
    checkpoint against the selection GRPO seeds' curve, and the chosen value. `records`: the selection runs,
    `{(label, seed): record}`."""
    import numpy as np

    from . import verdict
    from .records import points_at

    sel, base = cfg["selection"], setting(cfg, cfg["baseline"])
    steps, at = sorted(sel["grpo_steps"]), int(sel["checkpoint"])
    grpo = np.stack([points_at(records[(base["label"], sd)], steps) for sd in sel["grpo_seeds"]])
    out: dict[str, Any] = {"checkpoint": at, "grpo_seeds": sel["grpo_seeds"], "seeds": sel["seeds"], "settings": {}}
    for s in cfg["settings"]:
        if s.get("role") != "tuned":
            continue
        values = []
        for value in s["grid"]:
            label = f"{s['label']}@{grid_label(value)}"
            m = np.stack([points_at(records[(label, sd)], [at])[0] for sd in sel["seeds"]])
            effect = verdict.point_effect(grpo, m)
            values.append({"value": value, "label": grid_label(value), "effect": None if np.isnan(effect) else effect,
                           "mean": m.mean(axis=0).tolist()})
        eligible = [v for v in values if v["effect"] is not None]
        best = max(eligible, key=lambda v: v["effect"]) if eligible else values[0]  # max keeps the first of ties
        out["settings"][s["label"]] = {"grid": values, "chosen": best["value"], "chosen_label": best["label"],
                                       "reason": "largest effect" if eligible else "no eligible value: the paper's"}
    return out


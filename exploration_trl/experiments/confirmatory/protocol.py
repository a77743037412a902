"""The pre-registered confirmatory protocol (issue 37; docs/math.md, "The confirmatory verdict"): what runs, what is
compared and how, fixed in this commit before any of its runs. The second protocol's additions: `protocol_v2.py`.

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
    base = next(s for s in cfg["settings"] if s["label"] == cfg["baseline"])
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
    cfg.setdefault("bootstrap", {"resamples": 10000, "seed": 271828, "correction": "inflate_t"})
    cfg.setdefault("alpha", 0.05)
    from . import protocol_v2

    return protocol_v2.check(cfg, path) if protocol_v2.is_v2(cfg) else cfg


def quick(cfg: dict[str, Any]) -> dict[str, Any]:
    """A minutes-long smoke version of a countdown protocol: tiny data, model, budgets and evaluation, 2 seeds."""
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

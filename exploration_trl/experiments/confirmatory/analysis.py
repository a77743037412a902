"""A set-up's verdict from its finished runs, for either protocol: the test of every (setting, checkpoint), Holm's
correction, the nulls and the secondary analysis, written to `result.json`, `table.md` and `plot.png`.

What the protocol's YAML asks for decides what is computed and reported (`protocol.py` says why each was chosen):

* `bootstrap`: the test's options (`verdict.test`); `estimator` and `spread` are reported only when named.
* `holm: primary`: two Holm families, every setting's primary (last) checkpoint and, apart, the middle ones; each
  test says its `family`. Without it, one family over every test (the first protocol).
* `secondary`: the bootstrap over seeds and held-out number multisets together (`seeds_and_multisets`), from the
  records' per-problem counts.
* `null`: the null simulated from a noise model fitted to this set-up's GRPO seeds (raw and smoothed truth,
  `calibration.py`), and directed splits of them. Without it, the first protocol's nulls: independent normal seed
  noise at each checkpoint, and GRPO's `null_seeds` against its seeds and every split of the ten.
* `selection`, `role`s, `protocol_version: 2`: the selection's decision, each arm's role, the records' provenance and
  every arm's seed-mean trajectory are reported.

The verdict's words (`verdict_of`, pinned by configs/confirmatory/countdown3_v2_pins.yaml) are here too: the pinned
`combine_v2.py` imports them, with `fill_block`, from this module.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .. import _common
from . import calibration, protocol, provenance, runner, verdict
from .records import counts_at, points_at

RESULT_FILE, TABLE_FILE, PLOT_FILE = runner.RESULT_FILE, runner.TABLE_FILE, runner.PLOT_FILE
#: A checkpoint's fields under each setting, in this order, those its test has.
CHECKPOINT_FIELDS = ("effect", "effect_per_seed", "ci", "p", "p_holm", "family", "reason", "distances", "method_mean",
                     "seeds_and_multisets")


def boot_options(cfg: dict[str, Any]) -> dict[str, Any]:
    """The test's bootstrap options from the YAML's `bootstrap` (`estimator` and `spread` only when it names them)."""
    b = cfg["bootstrap"]
    out = {"resamples": int(b["resamples"]), "seed": int(b["seed"]),
           "correction": b.get("correction", verdict.CORRECTION)}
    if "estimator" in b:
        out["estimator"] = b["estimator"]
    if "spread" in b:
        out["spread"] = float(b["spread"])
    return out


def _test_options(boot: dict[str, Any]) -> dict[str, Any]:
    return {"correction": boot["correction"], "estimator": boot.get("estimator", verdict.ESTIMATOR),
            "spread": boot.get("spread", 1.0)}


# ------------------------------------------------------------------------------------------ secondary analysis
def seeds_and_multisets(grpo_counts: np.ndarray, method_counts: np.ndarray, groups: list[str], n: int,
                        resamples: int, seed: int) -> dict[str, Any]:
    """The mean-point effect with a bootstrap that resamples GRPO's seeds, the method's seeds and the held-out
    problems' number multisets (whole multisets, with replacement) together: uncertainty over problems too.

    `grpo_counts` `(S_g, K, P)` and `method_counts` `(S_m, P)`: correct samples of `n` per problem; `groups` `(P,)`
    each problem's multiset. pass@1 is the mean of count / n, pass@n the share of problems with a correct sample.
    Plain percentile bootstrap (no inflation): a secondary, descriptive analysis."""
    rng = np.random.default_rng(seed)
    keys = sorted(set(groups))
    member = np.array([keys.index(g) for g in groups])
    s_g, _, p = grpo_counts.shape
    s_m = method_counts.shape[0]

    def metrics(counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """`(..., 2)` pass@1 and pass@n of `counts` `(..., P)` under problem `weights` `(R, P)` -> `(R, ..., 2)`."""
        flat = counts.reshape(-1, p)
        total = weights.sum(axis=1)[:, None]
        p1 = (weights @ (flat / n).T) / total
        pn = (weights @ (flat > 0).T.astype(float)) / total
        return np.stack([p1, pn], axis=-1).reshape(weights.shape[0], *counts.shape[:-1], 2)

    everything = np.ones((1, p))
    observed = verdict.point_effect(metrics(grpo_counts, everything)[0], metrics(method_counts, everything)[0])
    effects = np.empty(resamples)
    batch = 250
    for start in range(0, resamples, batch):
        r = min(batch, resamples - start)
        draw = rng.integers(0, len(keys), size=(r, len(keys)))
        multiplicity = np.stack([np.bincount(d, minlength=len(keys)) for d in draw])  # (r, groups)
        weights = multiplicity[:, member].astype(float)  # (r, P)
        g = metrics(grpo_counts, weights)  # (r, S_g, K, 2)
        m = metrics(method_counts, weights)  # (r, S_m, 2)
        gi = rng.integers(0, s_g, size=(r, s_g))
        mi = rng.integers(0, s_m, size=(r, s_m))
        for j in range(r):
            effects[start + j] = verdict.point_effect(g[j][gi[j]], m[j][mi[j]])
    outside = np.isnan(effects)
    valid = np.where(outside, -1.0, effects)
    lo, hi = np.quantile(valid, [0.025, 0.975])
    p_value = float((outside | (np.nan_to_num(effects, nan=-1.0) <= 0)).mean())
    return {"effect": None if np.isnan(observed) else float(observed), "ci": [float(lo), float(hi)], "p": p_value,
            "resamples": resamples, "seed": seed, "multisets": len(keys), "problems": p}


# ------------------------------------------------------------------------------------------------- the nulls
def directed_splits_null(runs: np.ndarray, checkpoint_index: int, half: int, splits: int, boot: dict[str, Any],
                         seed: int) -> dict[str, Any]:
    """Directed splits of GRPO's seeds `runs` `(S, K, 2)`: `half` seeds make the curve, `half` others are the
    "method" at the checkpoint. All of them when there are at most `splits`, else a uniform sample of `splits`."""
    s = runs.shape[0]
    total = math.comb(s, half) * math.comb(s - half, half)
    rng = np.random.default_rng(seed)
    if total <= splits:
        chosen = [(list(a), list(b)) for a in itertools.combinations(range(s), half)
                  for b in itertools.combinations([i for i in range(s) if i not in a], half)]
    else:
        orders = [rng.permutation(s) for _ in range(splits)]
        chosen = [(list(o[:half]), list(o[half:2 * half])) for o in orders]
    ps, effects = [], []
    for i, (curve_seeds, method_seeds) in enumerate(chosen):
        r = verdict.test(runs[curve_seeds], runs[method_seeds, checkpoint_index], resamples=2000, seed=seed + i,
                         **_test_options(boot))
        ps.append(r["p"])
        effects.append(r["effect"])
    known = [p for p in ps if p is not None]
    hits = sum(p < 0.05 for p in known)
    lo, hi = calibration.wilson(hits, len(known))
    return {"directed_splits": total, "tested": len(chosen), "sampled": total > splits,
            "no_verdict": len(ps) - len(known),
            "share_p_below_0.05": hits / len(known) if known else None, "ci95": [lo, hi],
            "mean_effect": float(np.mean([e for e in effects if e is not None])) if known else None,
            "note": "the splits share seeds, so they are not independent draws"}


def _seed_noise_nulls(base, bsteps, grpo, records, checkpoints, boot) -> dict[str, Any]:
    """No `null` section (the first protocol): independent normal seed noise at each checkpoint, simulated; GRPO's
    `null_seeds` against its seeds, and every split of them all, as the empirical null."""
    idx = {c: bsteps.index(c) for c in checkpoints}
    sim = {str(c): verdict.null_false_positive_rate(grpo.mean(axis=0), grpo.std(axis=0, ddof=1), idx[c],
                                                    n_grpo=len(base["seeds"]), correction=boot["correction"], seed=1)
           for c in checkpoints}
    empirical = {}
    null_seeds = base.get("null_seeds", [])
    if null_seeds and all((base["label"], sd) in records for sd in null_seeds):
        null = np.stack([points_at(records[(base["label"], sd)], bsteps) for sd in null_seeds])
        for c in checkpoints:
            r = verdict.test(grpo, null[:, idx[c]], resamples=boot["resamples"], seed=boot["seed"],
                             **_test_options(boot))
            both = np.concatenate([grpo, null])
            empirical[str(c)] = {"null_seeds_vs_seeds": {k: r[k] for k in ("effect", "ci", "p")},
                                 "all_splits": verdict.empirical_null(both, idx[c], 2000, boot["seed"],
                                                                      correction=boot["correction"])}
    return {"null_false_positive_rate": max(v["false_positive_rate"] for v in sim.values()),
            "null_simulation": sim, "empirical_null": empirical}


def _fitted_nulls(cfg, base, bsteps, grpo, tests, boot) -> dict[str, Any]:
    """The YAML's `null` section (the second protocol): the test simulated under a noise model fitted to GRPO's seeds
    (raw and smoothed truth), at every compared checkpoint GRPO reached, and directed splits of GRPO's seeds."""
    null = cfg["null"]
    compared = sorted({t["checkpoint"] for t in tests if t["checkpoint"] in bsteps})
    noise = calibration.fit_noise(grpo)
    models = {"raw": noise, "smooth": calibration.smoothed(noise, bsteps)}
    n_method = max(len(s["seeds"]) for s in cfg["settings"] if s is not base)
    sim = {name: {str(c): calibration.null_rate(model, bsteps.index(c), len(base["seeds"]), n_method,
                                                simulations=int(null.get("simulations", 10000)),
                                                resamples=int(null.get("resamples", 2000)),
                                                seed=int(null.get("seed", 101)), **_test_options(boot))
                  for c in compared}
           for name, model in models.items()}
    worst = max((r for m in sim.values() for r in m.values()), key=lambda r: r["rate"])
    half = len(base["seeds"]) // 2
    empirical = {str(c): directed_splits_null(grpo, bsteps.index(c), half, int(null.get("splits", 10000)), boot,
                                              int(null.get("seed", 101))) for c in compared}
    return {"null_false_positive_rate": worst["rate"], "null_false_positive_mc_se": worst["mc_se"],
            "null_false_positive_ci95": worst["ci95"], "null_simulation": sim, "empirical_null": empirical}


# ---------------------------------------------------------------------------------------------- the verdict
def _tests(cfg, records, base, grpo, boot, secondary) -> list[dict[str, Any]]:
    """Every (setting, checkpoint) test, Holm-adjusted within its family."""
    families = cfg.get("holm") == "primary"
    tests = []
    for s in cfg["settings"]:
        if s is base:
            continue
        compared = protocol.checkpoints_of(cfg, s)
        for c in compared:
            m = np.stack([points_at(records[(s["label"], sd)], [c])[0] for sd in s["seeds"]])
            r = verdict.test(grpo, m, resamples=boot["resamples"], seed=boot["seed"], **_test_options(boot))
            t = {"label": s["label"], **({"role": s.get("role")} if "role" in s else {}), "checkpoint": c,
                 **({"family": "primary" if c == compared[-1] else "middle"} if families else {}), **r,
                 "method_mean": m.mean(axis=0).tolist()}
            if secondary is not None:
                mc = np.stack([counts_at(records[(s["label"], sd)], [c])[0] for sd in s["seeds"]])
                t["seeds_and_multisets"] = secondary(mc)
            tests.append(t)
    for family in ("primary", "middle") if families else (None,):
        members = [t for t in tests if t.get("family") == family]
        for t, ph in zip(members, verdict.holm([t["p"] for t in members])):
            t["p_holm"] = ph
    return tests


def _settings(cfg, records, base, bsteps, grpo, tests) -> list[dict[str, Any]]:
    """The reference arm's trajectory, then each setting's primary test and its tests by checkpoint (and, in a
    second-protocol set-up, its own seed-mean trajectory)."""
    trajectories = protocol.is_v2(cfg)
    out = [{"label": base["label"], "method": base["method"], "seeds": base["seeds"],
            **({"null_seeds": base["null_seeds"]} if "null_seeds" in base else {}), "steps": bsteps,
            "trajectory_mean": grpo.mean(axis=0).tolist()}]
    for s in cfg["settings"]:
        if s is base:
            continue
        mine = {t["checkpoint"]: t for t in tests if t["label"] == s["label"]}
        compared = protocol.checkpoints_of(cfg, s)
        top = mine[compared[-1]]
        ran = records[(s["label"], s["seeds"][0])]  # a tuned setting's overrides are the selection's
        entry = {"label": s["label"], **({"role": s.get("role")} if "role" in s else {}), "method": s["method"],
                 "overrides": ran["overrides"] if "overrides" in ran else s.get("overrides", {}), "seeds": s["seeds"],
                 "checkpoint": compared[-1], "effect": top["effect"], "ci": top["ci"], "p": top["p"],
                 "p_holm": top["p_holm"], "reason": top["reason"]}
        if trajectories:
            steps = sorted(s["steps"])
            entry["steps"] = steps
            entry["trajectory_mean"] = np.stack([points_at(records[(s["label"], sd)], steps)
                                                 for sd in s["seeds"]]).mean(axis=0).tolist()
        entry["checkpoints"] = {str(c): {k: t[k] for k in CHECKPOINT_FIELDS if k in t} for c, t in mine.items()}
        out.append(entry)
    return out


def analyse(cfg: dict[str, Any], records: dict[tuple[str, int], dict], model_params: int | None,
            heldout: dict[str, Any], selection_records: dict | None = None, selection: dict | None = None,
            groups: list[str] | None = None) -> dict[str, Any]:
    """The set-up's `result.json` content. `records`: the confirmation runs `{(label, seed): record}`;
    `selection_records` and `selection` (a `selection` split): its runs and decision; `groups`: each held-out
    problem's number multiset (a `secondary` analysis)."""
    boot = boot_options(cfg)
    second = protocol.is_v2(cfg)
    origin = None
    if second:
        every = {**records, **{("selection:" + k[0], k[1]): v for k, v in (selection_records or {}).items()}}
        origin = provenance.check_same(every, (cfg.get("provenance") or {}).get("declared"))
    base = protocol.setting(cfg, cfg["baseline"])
    bsteps = sorted(base["steps"])
    grpo = np.stack([points_at(records[(base["label"], sd)], bsteps) for sd in base["seeds"]])
    secondary = None
    if cfg.get("secondary"):
        sec = cfg["secondary"].get("seeds_and_multisets") or {"resamples": 2000, "seed": 161803}
        grpo_counts = np.stack([counts_at(records[(base["label"], sd)], bsteps) for sd in base["seeds"]])
        n = int(next(iter(records.values()))["n_samples"])

        def secondary(method_counts):
            return seeds_and_multisets(grpo_counts, method_counts, groups, n, int(sec["resamples"]), int(sec["seed"]))

    tests = _tests(cfg, records, base, grpo, boot, secondary)
    checkpoints = sorted(cfg["checkpoints"])
    nulls = (_fitted_nulls(cfg, base, bsteps, grpo, tests, boot) if cfg.get("null") else
             _seed_noise_nulls(base, bsteps, grpo, records, checkpoints, boot))
    head = {"name": cfg["name"], **({"protocol_version": cfg["protocol_version"]} if second else {}),
            "model_params": model_params, "task": cfg.get("task_description", cfg["task"]), "heldout": heldout}
    if second:
        head.update(provenance=origin, selection=selection)
    if secondary is not None:
        head["per_problem_records"] = (f"confirmatory_state/{cfg['name']}/runs/*.json "
                                       "(correct_counts: step -> correct samples per problem)")
    return {**head, **nulls, "checkpoints": checkpoints, "bootstrap": boot, "alpha": cfg.get("alpha", 0.05),
            **({"holm": cfg["holm"]} if "holm" in cfg else {}),
            "settings": _settings(cfg, records, base, bsteps, grpo, tests), "tests": tests}


def table(result: dict[str, Any]) -> str:
    """Every test in one Markdown table; the role, family, per-seed and secondary columns when the set-up has them."""
    def pts(v):
        return "-" if v is None else f"{100 * v:+.2f}"

    def p(v):
        return "-" if v is None else f"{v:.4f}"

    tests = result["tests"]
    extra = [(name, key) for name, key in (("role", "role"), ("family", "family"),
                                           ("per-seed reading (0.7.0's)", "effect_per_seed"),
                                           ("seeds and multisets", "seeds_and_multisets"))
             if any(key in t for t in tests)]
    rows = []
    for t in tests:
        ci = "-" if t["ci"] is None else f"[{100 * t['ci'][0]:+.1f}, {100 * t['ci'][1]:+.1f}]"
        cells = {"role": t.get("role") or "", "family": t.get("family") or "", "effect_per_seed":
                 pts(t.get("effect_per_seed"))}
        if "seeds_and_multisets" in t:
            sm = t["seeds_and_multisets"]
            cells["seeds_and_multisets"] = f"{pts(sm['effect'])}, p {sm['p']:.3f}"
        rows.append([t["label"], t["checkpoint"], pts(t["effect"]), ci, p(t["p"]), p(t["p_holm"]),
                     *(cells[key] for _, key in extra), t["reason"] or ""])
    return _common.markdown_table(["setting", "checkpoint", "effect (pts of pass@n)", "95% CI", "p", "p_holm",
                                   *(name for name, _ in extra), "no verdict"], rows)


def plot(result: dict[str, Any], records: dict[tuple[str, int], dict], path: Path) -> Path | None:
    """GRPO's seeds (grey) and seed-mean trajectory (black); each setting's trajectory when the set-up reports it
    (dashed: the negative control), else its seed means at the compared checkpoints (circles: the primary one)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 6))
    base = result["settings"][0]
    for (label, _), rec in records.items():
        if label == base["label"]:
            pts = np.array([(r["pass@1"], r["pass@n"]) for r in rec["rows"]])
            ax.plot(pts[:, 0], pts[:, 1], color="0.8", lw=0.6)
    traj = np.array(base["trajectory_mean"])
    ax.plot(traj[:, 0], traj[:, 1], "k-o", lw=2, label=f"{base['label']} (seed mean, reference)")
    for k, s in enumerate(result["settings"][1:]):
        colour = f"C{k % 10}"
        if "trajectory_mean" in s:
            t = np.array(s["trajectory_mean"])
            ax.plot(t[:, 0], t[:, 1], "--" if s.get("role") == "negative_control" else "-", marker="o", color=colour,
                    alpha=0.8, label=s["label"])
            continue
        for c, t in s["checkpoints"].items():
            ax.scatter([t["method_mean"][0]], [t["method_mean"][1]], color=colour,
                       marker="o" if c == str(s["checkpoint"]) else "^", label=f"{s['label']} @ {c}")
    ax.set_xlabel("held-out pass@1")
    ax.set_ylabel("held-out pass@n")
    ax.set_title(f"{result['name']}: every arm against GRPO's trajectory")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_verdict(cfg: dict[str, Any], output: Path, log=print) -> dict[str, Any]:
    """Analyse the finished runs of `output` (a countdown set-up) and write `result.json`, `table.md` and
    `plot.png`."""
    from .heldout import multiset_key

    output = Path(output)
    records = runner.collect(output)
    _, held, info = runner.split(cfg, output)
    ws = json.loads((output / "warm_start" / "warm_start.json").read_text())
    heldout = {"n_problems": info["n_problems"], "disjoint_from_training": info["disjoint_from_training"],
               "checksum": info["checksum"], "warm_start_checksum": ws["checksum"]}
    extra: dict[str, Any] = {}
    if protocol.is_v2(cfg):
        heldout["multisets"] = info["heldout_multisets_evaluated"]
        sel_path = output / "selection.json"
        selection = json.loads(sel_path.read_text()) if sel_path.is_file() else None
        if selection is not None and "selection" in info:
            selection = {**selection, "split": {k: v for k, v in info["selection"].items() if k != "problems"}}
        extra = {"selection_records": runner.collect(output, "selection"), "selection": selection}
    if cfg.get("secondary"):
        extra["groups"] = [multiset_key(p["nums"]) for p in held]
    result = analyse(cfg, records, ws["num_parameters"], heldout, **extra)
    write(output, result, records)
    log(f"[confirm] {cfg['name']}: wrote {output / RESULT_FILE}, {TABLE_FILE}, {PLOT_FILE}")
    return result


def write(output: Path, result: dict[str, Any], records: dict[tuple[str, int], dict]) -> None:
    _common.write_json(Path(output) / RESULT_FILE, result)
    (Path(output) / TABLE_FILE).write_text(table(result) + "\n")
    plot(result, records, Path(output) / PLOT_FILE)


# ------------------------------------------------------------------------------- the words of a verdict
def verdict_of(t: dict[str, Any], alpha: float) -> str:
    """One test's verdict in words: beats GRPO's trajectory only when Holm's adjusted p is below `alpha`."""
    if t["p"] is None:
        return f"no verdict ({t['reason']})"
    outside = t.get("outside_resamples") or 0.0
    note = (f" ({outside:.0%} of resamples put a seed outside GRPO's curve: counted as the lowest effect, -100)"
            if outside > 0 else "")
    if t["p_holm"] < alpha:
        return "**beats GRPO**" + note
    return "not shown to beat GRPO" + note


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _short_verdict(t: dict[str, Any], alpha: float) -> str:
    if t["p"] is None:
        return f"no verdict: {t['reason']}"
    return "**beats GRPO**" if t["p_holm"] < alpha else "not shown to beat GRPO"


def fill_block(path: Path, body: str, start: str, end: str) -> None:
    """Replace the text between the marker lines `start` and `end` in `path` with `body`."""
    text = Path(path).read_text()
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"{path}: needs exactly one {start} and one {end} line around the verdicts")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    Path(path).write_text(f"{head}{start}\n{body}{end}{tail}")

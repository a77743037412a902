"""The second protocol's verdict (`protocol_v2.py`): provenance checked, the test of every (setting, checkpoint) with
the protocol's bootstrap options, Holm over the primary checkpoints (and, apart, over the middle ones), the secondary
bootstrap over seeds and number multisets, the nulls (simulated with this set-up's own GRPO seeds, and over directed
splits of them) and the selection that chose the tuned settings.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .. import _common
from . import calibration, protocol_v2, provenance, runner, verdict

RESULT_FILE, TABLE_FILE, PLOT_FILE = runner.RESULT_FILE, runner.TABLE_FILE, runner.PLOT_FILE


def _points(rec: dict, steps: list[int]) -> np.ndarray:
    by = {r["step"]: (r["pass@1"], r["pass@n"]) for r in rec["rows"]}
    return np.array([by[s] for s in steps], float)


def _counts(rec: dict, steps: list[int]) -> np.ndarray:
    """`(len(steps), problems)` correct counts of a run at `steps`."""
    by = rec.get("correct_counts") or {}
    return np.array([by[str(s)] for s in steps], float)


def _boot(cfg: dict[str, Any]) -> dict[str, Any]:
    b = cfg["bootstrap"]
    return {"resamples": int(b["resamples"]), "seed": int(b["seed"]),
            "correction": b.get("correction", verdict.CORRECTION), "estimator": b.get("estimator", "mean_point"),
            "spread": float(b.get("spread", 1.0))}


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
    s_g, k, p = grpo_counts.shape
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
def empirical_null(runs: np.ndarray, checkpoint_index: int, half: int, splits: int, boot: dict[str, Any],
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
                         correction=boot["correction"], estimator=boot["estimator"], spread=boot["spread"])
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


# ---------------------------------------------------------------------------------------------- the verdict
def analyse(cfg: dict[str, Any], records: dict[tuple[str, int], dict], selection_records: dict, selection: dict | None,
            model_params: int | None, heldout: dict[str, Any], groups: list[str]) -> dict[str, Any]:
    boot = _boot(cfg)
    every = {**records, **{("selection:" + k[0], k[1]): v for k, v in selection_records.items()}}
    origin = provenance.check_same(every, (cfg.get("provenance") or {}).get("declared"))
    base = next(s for s in cfg["settings"] if s["label"] == cfg["baseline"])
    bsteps = sorted(base["steps"])
    grpo = np.stack([_points(records[(base["label"], sd)], bsteps) for sd in base["seeds"]])
    grpo_counts = np.stack([_counts(records[(base["label"], sd)], bsteps) for sd in base["seeds"]])
    n = int(next(iter(records.values()))["n_samples"])
    sec = (cfg.get("secondary") or {}).get("seeds_and_multisets") or {"resamples": 2000, "seed": 161803}
    tests = []
    for s in cfg["settings"]:
        if s is base:
            continue
        compared = protocol_v2.checkpoints_of(cfg, s)
        for c in compared:
            m = np.stack([_points(records[(s["label"], sd)], [c])[0] for sd in s["seeds"]])
            r = verdict.test(grpo, m, resamples=boot["resamples"], seed=boot["seed"], correction=boot["correction"],
                             estimator=boot["estimator"], spread=boot["spread"])
            mc = np.stack([_counts(records[(s["label"], sd)], [c])[0] for sd in s["seeds"]])
            r2 = seeds_and_multisets(grpo_counts, mc, groups, n, int(sec["resamples"]), int(sec["seed"]))
            tests.append({"label": s["label"], "role": s.get("role"), "checkpoint": c,
                          "family": "primary" if c == compared[-1] else "middle", **r,
                          "method_mean": m.mean(axis=0).tolist(), "seeds_and_multisets": r2})
    for family in ("primary", "middle"):
        members = [t for t in tests if t["family"] == family]
        for t, ph in zip(members, verdict.holm([t["p"] for t in members])):
            t["p_holm"] = ph
    settings = [{"label": base["label"], "method": base["method"], "seeds": base["seeds"], "steps": bsteps,
                 "trajectory_mean": grpo.mean(axis=0).tolist()}]
    for s in cfg["settings"]:
        if s is base:
            continue
        mine = {t["checkpoint"]: t for t in tests if t["label"] == s["label"]}
        compared = protocol_v2.checkpoints_of(cfg, s)
        top = mine[compared[-1]]
        traj = np.stack([_points(records[(s["label"], sd)], sorted(s["steps"])) for sd in s["seeds"]]).mean(axis=0)
        settings.append({
            "label": s["label"], "role": s.get("role"), "method": s["method"],
            "overrides": records[(s["label"], s["seeds"][0])].get("overrides", {}), "seeds": s["seeds"],
            "checkpoint": compared[-1], "effect": top["effect"], "ci": top["ci"], "p": top["p"],
            "p_holm": top["p_holm"], "reason": top["reason"], "steps": sorted(s["steps"]),
            "trajectory_mean": traj.tolist(),
            "checkpoints": {str(c): {k: t.get(k) for k in ("effect", "effect_per_seed", "ci", "p", "p_holm", "family",
                                                          "reason", "distances", "method_mean",
                                                          "seeds_and_multisets")}
                            for c, t in mine.items()}})
    null = cfg.get("null") or {}
    compared_steps = sorted({c for t in tests for c in [t["checkpoint"]] if c in bsteps})
    noise = calibration.fit_noise(grpo)
    models = {"raw": noise, "smooth": calibration.smoothed(noise, bsteps)}
    n_method = max(len(s["seeds"]) for s in cfg["settings"] if s is not base)
    sim = {name: {str(c): calibration.null_rate(model, bsteps.index(c), len(base["seeds"]), n_method,
                                                simulations=int(null.get("simulations", 10000)),
                                                resamples=int(null.get("resamples", 2000)),
                                                seed=int(null.get("seed", 101)), correction=boot["correction"],
                                                estimator=boot["estimator"], spread=boot["spread"])
                  for c in compared_steps}
           for name, model in models.items()}
    worst = max((r for m in sim.values() for r in m.values()), key=lambda r: r["rate"])
    half = len(base["seeds"]) // 2
    empirical = {str(c): empirical_null(grpo, bsteps.index(c), half, int(null.get("splits", 10000)), boot,
                                        int(null.get("seed", 101))) for c in compared_steps}
    return {"name": cfg["name"], "protocol_version": 2, "model_params": model_params,
            "task": cfg.get("task_description", cfg["task"]), "heldout": heldout, "provenance": origin,
            "selection": selection, "per_problem_records": f"confirmatory_state/{cfg['name']}/runs/*.json "
                                                          "(correct_counts: step -> correct samples per problem)",
            "null_false_positive_rate": worst["rate"], "null_false_positive_mc_se": worst["mc_se"],
            "null_false_positive_ci95": worst["ci95"], "null_simulation": sim, "empirical_null": empirical,
            "checkpoints": cfg["checkpoints"], "bootstrap": boot, "alpha": cfg.get("alpha", 0.05),
            "holm": cfg.get("holm", "primary"), "settings": settings, "tests": tests}


def table(result: dict[str, Any]) -> str:
    def pct(v):
        return "-" if v is None else f"{100 * v:+.2f}"

    rows = []
    for t in result["tests"]:
        ci = "-" if t["ci"] is None else f"[{100 * t['ci'][0]:+.1f}, {100 * t['ci'][1]:+.1f}]"
        sm = t["seeds_and_multisets"]
        rows.append([t["label"], t.get("role") or "", t["checkpoint"], t["family"], pct(t["effect"]), ci,
                     "-" if t["p"] is None else f"{t['p']:.4f}", "-" if t["p_holm"] is None else f"{t['p_holm']:.4f}",
                     pct(t.get("effect_per_seed")), f"{pct(sm['effect'])}, p {sm['p']:.3f}", t["reason"] or ""])
    return _common.markdown_table(["setting", "role", "checkpoint", "family", "effect (pts)", "95% CI", "p", "p_holm",
                                   "per-seed reading (0.7.0's)", "seeds and multisets", "no verdict"], rows)


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Every setting's seed-mean trajectory against GRPO's."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 6))
    base = result["settings"][0]
    traj = np.array(base["trajectory_mean"])
    ax.plot(traj[:, 0], traj[:, 1], "k-o", lw=2, label=f"{base['label']} (seed mean, reference)")
    for k, s in enumerate(result["settings"][1:]):
        t = np.array(s["trajectory_mean"])
        style = "--" if s.get("role") == "negative_control" else "-"
        ax.plot(t[:, 0], t[:, 1], style, marker="o", color=f"C{k % 10}", alpha=0.8, label=s["label"])
    ax.set_xlabel("held-out pass@1")
    ax.set_ylabel("held-out pass@n")
    ax.set_title(f"{result['name']}: every arm's trajectory against GRPO's")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_verdict(cfg: dict[str, Any], output: Path, log=print) -> dict[str, Any]:
    """Analyse the finished runs of `output` and write `result.json`, `table.md` and `plot.png`."""
    from .heldout import multiset_key

    output = Path(output)
    records = runner.collect(output)
    selection_records = runner.collect(output, "selection")
    sel_path = output / "selection.json"
    selection = json.loads(sel_path.read_text()) if sel_path.is_file() else None
    _, held, info = runner.split(cfg, output)
    ws = json.loads((output / "warm_start" / "warm_start.json").read_text())
    heldout = {"n_problems": info["n_problems"], "disjoint_from_training": info["disjoint_from_training"],
               "checksum": info["checksum"], "warm_start_checksum": ws["checksum"],
               "multisets": info["heldout_multisets_evaluated"]}
    if selection is not None and "selection" in info:
        selection = {**selection, "split": {k: v for k, v in info["selection"].items() if k != "problems"}}
    result = analyse(cfg, records, selection_records, selection, ws["num_parameters"], heldout,
                     [multiset_key(p["nums"]) for p in held])
    _common.write_json(output / RESULT_FILE, result)
    (output / TABLE_FILE).write_text(table(result) + "\n")
    plot(result, output / PLOT_FILE)
    log(f"[confirm] {cfg['name']}: wrote {output / RESULT_FILE}, {TABLE_FILE}, {PLOT_FILE}")
    return result

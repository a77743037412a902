"""The first protocol's verdicts in docs/confirmatory.json and the docs' tables (`confirm --combine` of set-ups
whose result has no `protocol_version`): one table per set-up with the distinct-correct counts beside, a short summary
with the nulls, and the blocks of README.md and docs/confirmatory.md they fill. The second protocol's: `combine_v2.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .. import _common
from .analysis import _pct, _short_verdict, fill_block, verdict_of

#: Per-run values reported beside the verdict (not tested): distinct correct equations per problem as written and
#: up to commutativity and associativity (`rewards.countdown.canonical_equation`), and token entropy.
DIVERSITY_KEYS = ("distinct_correct", "distinct_correct_canonical", "token_entropy")


def diversity(result: dict[str, Any], records: dict[tuple[str, int], dict]) -> dict[str, dict[str, dict]]:
    """`{label: {checkpoint: {key: mean over the setting's seeds}}}` at the compared checkpoints, for every setting
    (GRPO too); a key some run did not record (e.g. a `task: train` protocol) is None."""
    out: dict[str, dict[str, dict]] = {}
    for s in result["settings"]:
        out[s["label"]] = {}
        for c in result["checkpoints"]:
            rows = [next((r for r in records[(s["label"], sd)]["rows"] if r["step"] == c), {}) for sd in s["seeds"]]
            out[s["label"]][str(c)] = {k: (float(np.mean([r[k] for r in rows]))
                                           if all(r.get(k) is not None for r in rows) else None)
                                       for k in DIVERSITY_KEYS}
    return out


def combine(results: list[dict], protocol_commit: str,
            diversities: list[dict] | None = None) -> dict[str, Any]:
    """`docs/confirmatory.json`'s content from each set-up's `result.json` (and, when given, its `diversity`).
    Each set-up has its own held-out set; the top-level `heldout.n_problems` is the smallest of them (every set-up
    was judged on at least that many problems), `per_setup` gives each."""
    sizes = {r["name"]: r["heldout"]["n_problems"] for r in results}
    setups = [r if d is None else {**r, "diversity": d}
              for r, d in zip(results, diversities or [None] * len(results))]
    return {"protocol_commit": protocol_commit,
            "heldout": {"n_problems": min(sizes.values()), "per_setup": sizes,
                        "disjoint_from_training": all(r["heldout"]["disjoint_from_training"] for r in results)},
            "setups": setups}


def _p_formats(setup: dict[str, Any]):
    """Formatters for a set-up's p and p_holm. A bootstrap p of 0 means below one resample in R (`< 1/R`); its Holm
    adjustment is then below m/R, with m the set-up's number of tests."""
    resamples = (setup.get("bootstrap") or {}).get("resamples")
    m = sum(t["p"] is not None for t in setup["tests"])

    def fmt(bound):
        return lambda v: "-" if v is None else (f"< {bound:.4f}" if v == 0 and resamples else f"{v:.4f}")

    return fmt(1 / resamples if resamples else 0), fmt(min(1.0, m / resamples) if resamples else 0)


def summary_markdown(combined: dict[str, Any]) -> str:
    """The verdicts in one short table (README): per set-up and setting, the primary (last) checkpoint's effect, 95%
    CI, Holm-adjusted p and verdict, and the middle checkpoint's effect and adjusted p; then the null rates: the
    simulated one, and the empirical one (GRPO-against-GRPO splits with p < 0.05 at each checkpoint)."""
    rows = []
    for r in combined["setups"]:
        alpha, primary = r.get("alpha", 0.05), r["checkpoints"][-1]
        _, p_holm_text = _p_formats(r)
        for setting in r["settings"][1:]:
            tests = {t["checkpoint"]: t for t in r["tests"] if t["label"] == setting["label"]}
            t = tests[primary]
            eff = "-" if t["effect"] is None else f"{100 * t['effect']:+.2f}"
            ci = ""
            if t["ci"] is not None:
                low = "outside" if t["ci"][0] <= -1.0 else f"{100 * t['ci'][0]:+.1f}"
                ci = f" [{low}, {100 * t['ci'][1]:+.1f}]"
            middle = "; ".join(
                f"{c}: " + ("no verdict" if m["p"] is None else
                            f"{100 * m['effect']:+.2f}, p_holm {p_holm_text(m['p_holm'])}, {_short_verdict(m, alpha)}")
                for c, m in tests.items() if c != primary)
            rows.append([r["name"], setting["label"], f"{primary}: {eff}{ci}", p_holm_text(t["p_holm"]),
                         _short_verdict(t, alpha), middle])
    nulls = ", ".join(f"{r['name']} {_pct(r['null_false_positive_rate'])}" for r in combined["setups"])
    empirical = "; ".join(filter(None, (_empirical_null_text(r) for r in combined["setups"])))
    empirical = (" Empirical null (every split of a set-up's GRPO seeds into two halves, one half the curve and the "
                 "other the \"method\"; the share of splits with p < 0.05; the splits share seeds, so they are not "
                 f"independent draws): {empirical}." if empirical else "")
    return (_common.markdown_table(["set-up", "setting", "primary checkpoint: effect (pts) [95% CI]", "p_holm",
                                    "verdict", "middle checkpoint"], rows)
            + "\n\nA CI bound \"outside\": more than 2.5% of resamples put a seed outside GRPO's curve, counted as the "
              "lowest effect. Null false-positive rate (GRPO against GRPO on other seeds, simulated at each set-up's "
              f"measured noise, drawn independently at each checkpoint, 1,000 simulations): {nulls}; re-measured "
              f"with each seed's deviations kept together in the calibration note below.{empirical} Pre-registered in commit {combined['protocol_commit'][:7]}.\n")


def _empirical_null_text(setup: dict[str, Any]) -> str | None:
    """A set-up's empirical null for the summary: `countdown3, 10 seeds split 5/5: 8.7% at step 700 and 0.0% at step
    1500 (126 splits each)`; a checkpoint where some splits had no verdict counts only those with one. None
    when the set-up has no empirical null."""
    found = [(c, v["all_splits"]) for c, v in (setup.get("empirical_null") or {}).items()
             if v["all_splits"]["share_p_below_0.05"] is not None]
    if not found:
        return None

    def splits(a: dict) -> str:
        known = a["splits"] - a["no_verdict"]
        return f"{known} splits" if a["no_verdict"] == 0 else f"{known} of {a['splits']} splits with a verdict"

    counts = {splits(a) for _, a in found}
    each = len(found) > 1 and len(counts) == 1
    parts = [f"{_pct(a['share_p_below_0.05'])} at step {c}" + ("" if each or len(found) == 1 else f" ({splits(a)})")
             for c, a in found]
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    if len(counts) == 1:
        text += f" ({next(iter(counts))}{' each' if each else ''})"
    base = setup["settings"][0]
    n = len(base.get("seeds", [])) + len(base.get("null_seeds", []))
    return f"{setup['name']}, {n} seeds split {n // 2}/{n - n // 2}: {text}"


def verdict_markdown(combined: dict[str, Any]) -> str:
    """The confirmatory verdicts as Markdown, one table per set-up (README and docs/confirmatory.md copy it)."""
    out = [f"Pre-registered in commit {combined['protocol_commit'][:7]}; "
           f"{combined['heldout']['n_problems']} held-out problems per set-up, "
           f"{'disjoint' if combined['heldout']['disjoint_from_training'] else 'NOT disjoint'} from training "
           "(whole number multisets). Effect: mean over the method's seeds of pass@n minus GRPO's seed-mean "
           "trajectory at the same pass@1, in points; one-sided p from the two-arm seed bootstrap; p_holm: Holm "
           "over all (setting, checkpoint) tests of the set-up. Distinct correct: equations per held-out problem, as "
           "written and up to commutativity and associativity (seed mean; reported, not tested)."]
    for r in combined["setups"]:
        alpha = r.get("alpha", 0.05)
        params = f"{r['model_params']:,} parameters" if r.get("model_params") else "model size not recorded"
        emp = r.get("empirical_null") or {}
        emp_txt = "; ".join(f"step {c}: {_pct(v['all_splits']['share_p_below_0.05'])} of "
                            f"{v['all_splits']['splits']} splits" for c, v in emp.items()
                            if v["all_splits"]["share_p_below_0.05"] is not None)
        out.append(f"\n**{r['name']}** ({r['task']}; {params}). Null false-positive rate (GRPO against GRPO, "
                   f"simulated at this set-up's measured seed noise, drawn independently at each checkpoint, 1,000 "
                   f"simulations; re-measured below, \"0.7.0 re-read\"): {_pct(r['null_false_positive_rate'])}"
                   + (f"; empirical, every 5/5 split of GRPO's 10 seeds: {emp_txt}" if emp_txt else "") + ".\n")
        by_label = {s["label"]: s for s in r["settings"]}
        div = r.get("diversity") or {}

        def distinct(label, c):
            d = div.get(label, {}).get(str(c), {})
            if d.get("distinct_correct") is None:
                return "-"
            return f"{d['distinct_correct']:.2f} / {d.get('distinct_correct_canonical') or float('nan'):.2f}"

        p_text, p_holm_text = _p_formats(r)
        base = r["settings"][0]
        rows = [[base["label"], base["method"], f"{c}{' (primary)' if c == r['checkpoints'][-1] else ''}",
                 len(base["seeds"]), "-", "-", "-", "-", distinct(base["label"], c), "(the reference trajectory)"]
                for c in r["checkpoints"]]
        for t in r["tests"]:
            primary = t["checkpoint"] == r["checkpoints"][-1]
            eff = "-" if t["effect"] is None else f"{100 * t['effect']:+.2f}"
            ci = "-" if t["ci"] is None else f"[{100 * t['ci'][0]:+.2f}, {100 * t['ci'][1]:+.2f}]"
            rows.append([t["label"], by_label[t["label"]]["method"],
                         f"{t['checkpoint']}{' (primary)' if primary else ''}", len(t.get("distances") or []) or "-",
                         eff, ci, p_text(t["p"]), p_holm_text(t["p_holm"]), distinct(t["label"], t["checkpoint"]),
                         verdict_of(t, alpha)])
        out.append(_common.markdown_table(["setting", "method", "checkpoint", "seeds", "effect (pts)", "95% CI", "p",
                                           "p_holm", "distinct correct (written / canonical)", "verdict"], rows))
    return "\n".join(out) + "\n"


#: The markers around the verdicts in README.md and docs/confirmatory.md (`fill_block` rewrites what is between).
BLOCK_START, BLOCK_END = "<!-- confirmatory:start -->", "<!-- confirmatory:end -->"

#: What the blocks say until docs/confirmatory.json exists.
PENDING = ("The confirmatory runs are under way; no verdict yet. Until both set-ups are complete, every "
           "comparison with GRPO in these docs is exploratory.\n")


#: The markers around the short table (README.md).
SUMMARY_START, SUMMARY_END = "<!-- confirmatory-summary:start -->", "<!-- confirmatory-summary:end -->"


def block_text(combined: dict[str, Any] | None) -> str:
    """What belongs between the markers: the verdicts, or `PENDING` before docs/confirmatory.json exists."""
    return PENDING if combined is None else verdict_markdown(combined)


def summary_text(combined: dict[str, Any] | None) -> str:
    """What belongs between the summary markers: the short table, or `PENDING`."""
    return PENDING if combined is None else summary_markdown(combined)


def fill_verdicts(path: Path, combined: dict[str, Any]) -> list[str]:
    """Fill each verdict block `path` has (the full tables, the summary, or both); returns which it filled."""
    text = Path(path).read_text()
    blocks = [(name, start, end, render) for name, start, end, render in (
        ("tables", BLOCK_START, BLOCK_END, block_text), ("summary", SUMMARY_START, SUMMARY_END, summary_text))
        if start in text]
    if not blocks:
        raise ValueError(f"{path}: has neither {BLOCK_START} nor {SUMMARY_START}; add one where the verdicts go")
    for _, start, end, render in blocks:
        fill_block(path, render(combined), start, end)
    return [name for name, *_ in blocks]

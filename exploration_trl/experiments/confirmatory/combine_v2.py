"""The second protocol's verdicts in docs/confirmatory.json (its `second_protocol` key, beside the first protocol's
set-ups) and in the docs' tables: the negative control first (a test that lets GRPO at half the learning rate "beat"
GRPO is not to be trusted on that set-up), then the tuned seed methods beside 0.7.0's verdicts at their published
settings, the five new methods and the replication of 0.7.0's two wins.

`exploration-trl confirm --combine <output dir> --protocol-commit <hash>` calls this for a set-up whose
`result.json` says `protocol_version: 2` (`analysis_v2.write_verdict` wrote it when its last run finished).
"""

from __future__ import annotations

from typing import Any

from .. import _common
from . import amendment as amend
from . import platform_rule
from .analysis import _pct, _short_verdict, verdict_of

#: The order of the arms in every table.
ROLES = ("negative_control", "tuned", "new", "replication")
ROLE_NAMES = {"negative_control": "negative control", "tuned": "tuned", "new": "new", "replication": "replication"}

#: The markers around the second protocol's tables (docs/confirmatory.md) and its short table (README.md).
BLOCK_START, BLOCK_END = "<!-- confirmatory-v2:start -->", "<!-- confirmatory-v2:end -->"
SUMMARY_START, SUMMARY_END = "<!-- confirmatory-v2-summary:start -->", "<!-- confirmatory-v2-summary:end -->"
#: README's "Which method should I use?" section, generated from the same json.
ADVICE_START, ADVICE_END = "<!-- which-method:start -->", "<!-- which-method:end -->"
PENDING = ("The second protocol's runs are under way (pre-registered in commit 4e6b608, run from a `git archive` of "
           "it); no verdict yet. Its finished runs are in `confirmatory_state/countdown3_v2/`.\n")


def earlier_verdict(first: dict[str, Any] | None, setup: str, setting: dict[str, Any]) -> dict[str, Any] | None:
    """0.7.0's verdict for the same method on the same task (the first protocol's set-up `setup`): the setting with
    the same label (a replication), else the one with the same method (a tuned method's published setting)."""
    if not first:
        return None
    found = next((s for s in first.get("setups", []) if s["name"] == setup), None)
    if found is None:
        return None
    same = [s for s in found["settings"][1:] if s["label"] == setting["label"]] or \
        [s for s in found["settings"][1:] if s["method"] == setting["method"]]
    if not same:
        return None
    primary = found["checkpoints"][-1]
    test = next(t for t in found["tests"] if t["label"] == same[0]["label"] and t["checkpoint"] == primary)
    return {"label": same[0]["label"], "overrides": same[0].get("overrides"), "checkpoint": primary,
            "effect": test["effect"], "ci": test["ci"], "p_holm": test["p_holm"],
            "verdict": _short_verdict(test, found.get("alpha", 0.05)).replace("**", "")}


def combine(results: list[dict[str, Any]], protocol_commit: str, first: dict[str, Any] | None,
            integrity: dict[str, dict] | None = None, amendments: dict[str, dict] | None = None,
            power: dict[str, dict] | None = None, platforms: dict[str, dict] | None = None) -> dict[str, Any]:
    """The `second_protocol` section: each set-up's result with, per arm, 0.7.0's verdict where there was one.
    `first`: the current docs/confirmatory.json (the first protocol's combined verdicts), or None. `integrity`: per
    set-up, what `integrity_v2.check` verified; `amendments`: per set-up, its amendment (the control's reading is
    computed here and kept in the json, so every verdict sentence is generated from it); `platforms`: per set-up,
    amendment 2's `platform_rule.section` (its platforms and their controls' readings)."""
    setups = []
    for r in results:
        a = (amendments or {}).get(r["name"])
        if a is not None:
            r = {**r, "amendment": {"file": str(amend.FILES[r["name"]]), "date": str(a["date"]),
                                    "control_label": a["control"]["label"],
                                    "not_interpretable_text": a["not_interpretable_text"],
                                    "not_checked_text": a["not_checked_text"],
                                    "control": amend.control_reading(r, a)}}
        if integrity and r["name"] in integrity:
            r = {**r, "integrity": integrity[r["name"]]}
        if power and r["name"] in power:
            r = {**r, "power": power[r["name"]]}
        if platforms and r["name"] in platforms:
            r = {**r, "platform_rule": platforms[r["name"]]}
        if r.get("protocol_version") != 2:
            raise ValueError(f"--combine: {r['name']} is a first-protocol result; combine the two protocols apart")
        earlier_of = (first or {}).get("setups", [])
        base_name = next((s["name"] for s in earlier_of if r["name"].startswith(s["name"])), None)
        arms = {s["label"]: earlier_verdict(first, base_name, s) for s in r["settings"][1:]} if base_name else {}
        setups.append({**r, "earlier": {"setup": base_name, "arms": {k: v for k, v in arms.items() if v}}})
    return {"protocol_commit": protocol_commit, "setups": setups}


def _ordered(setup: dict[str, Any]) -> list[dict[str, Any]]:
    arms = setup["settings"][1:]
    return sorted(arms, key=lambda s: (ROLES.index(s.get("role")) if s.get("role") in ROLES else len(ROLES)))


def _setting_text(setup: dict[str, Any], arm: dict[str, Any]) -> str:
    chosen = ((setup.get("selection") or {}).get("settings") or {}).get(arm["label"])
    overrides = arm.get("overrides") or {}
    shown = ", ".join(f"{k}={v}" for k, v in overrides.items())
    if chosen:
        shown = f"{shown} (chosen on the selection split)" if shown else "chosen on the selection split"
    return f"{arm['method']}" + (f": {shown}" if shown else "")


def _effect(t: dict[str, Any]) -> str:
    if t.get("effect") is None:
        return "-"
    ci = t.get("ci")
    if ci is None:
        return f"{100 * t['effect']:+.2f}"
    low = "outside" if ci[0] <= -1.0 else f"{100 * ci[0]:+.1f}"
    return f"{100 * t['effect']:+.2f} [{low}, {100 * ci[1]:+.1f}]"


def _verdict(setup: dict[str, Any], arm: dict[str, Any], t: dict[str, Any]) -> str:
    """The verdict of one test. Under amendment 1, a family whose control beat GRPO (raw p or Holm's p below alpha)
    has no verdict but "not interpretable"; one whose control could not be read says so beside each verdict. Then
    amendment 2: the platform controls of the platforms the arm was made on (`platform_rule.apply`)."""
    text = verdict_of(t, setup.get("alpha", 0.05))
    a = setup.get("amendment")
    if arm.get("role") == "negative_control":
        status = ((a or {}).get("control") or {}).get(t["family"], {}).get("status")
        if status == amend.FAILED or (t.get("p_holm") is not None and t["p_holm"] < setup.get("alpha", 0.05)):
            return text.replace("**beats GRPO**", "beats GRPO") + \
                ": **the control beat GRPO, so this set-up's test is not to be trusted**"
        return text if a is None else text + f" (raw p read at {a['control'][t['family']]['raw_alpha']:g}: {status})"
    if a is not None:
        override = amend.verdict_override(a, a["control"], t["family"])  # the section keeps the amendment's texts
        if override == a["not_interpretable_text"]:
            return f"**{override}**"
        text = text if override is None else f"{text} ({override})"
    won = t.get("p_holm") is not None and t["p_holm"] < setup.get("alpha", 0.05)
    return platform_rule.apply(setup.get("platform_rule"), arm["label"], t["family"], text, won)


def control_sentence(setup: dict[str, Any]) -> str:
    """Amendment 1's reading of the negative control, first in every table: its effect with the upper end of its
    95% CI, its raw and Holm p, and what that means for the set-up's verdicts."""
    a = setup.get("amendment")
    if a is None:
        return ""
    parts = []
    for family in ("primary", "middle"):
        c = a["control"].get(family)
        if c is None:
            continue
        if c["status"] == amend.NOT_CHECKED:
            parts.append(f"{family} checkpoint ({c['checkpoint']}): the control's effect could not be read, so the "
                         f"{family} verdicts are not checked against step size")
            continue
        upper = f"{100 * c['ci_upper']:+.1f}" if c["ci_upper"] is not None else "-"
        meaning = (f"every {family} verdict is not interpretable (a step-size change alone beats GRPO's trajectory)"
                   if c["status"] == amend.FAILED else
                   f"not significant, but its 95% CI reaches {upper} points, so a step-size effect that large is not "
                   "ruled out")
        parts.append(f"{family} checkpoint ({c['checkpoint']}): effect {100 * c['effect']:+.2f} points, 95% CI upper "
                     f"end {upper}, raw one-sided p {c['p']:.4f} (read at {c['raw_alpha']:g}), Holm's p "
                     f"{'-' if c['p_holm'] is None else format(c['p_holm'], '.4f')}: {c['status']}; {meaning}")
    return (f"**Negative control** (`{a['control_label']}`, read as amendment 1 of {a['date']} says, "
            f"`{a['file']}`): " + "; ".join(parts) + ".\n\n")


def _earlier_text(setup: dict[str, Any], arm: dict[str, Any]) -> str:
    e = (setup.get("earlier") or {}).get("arms", {}).get(arm["label"])
    if not e:
        return "-"
    eff = "-" if e["effect"] is None else f"{100 * e['effect']:+.2f}"
    return f"{e['label']} (step {e['checkpoint']}): {eff}, {e['verdict']}"


def _formats(setup: dict[str, Any], family: str):
    """p and Holm's p as text: a bootstrap p of 0 is below 1/R, its Holm adjustment below m/R with m the number of
    tests of its Holm family (the primary checkpoints, or the middle ones) that have a p."""
    resamples = (setup.get("bootstrap") or {}).get("resamples")
    m = sum(t["p"] is not None for t in setup["tests"] if t["family"] == family)

    def fmt(bound):
        return lambda v: "-" if v is None else (f"< {bound:.4f}" if v == 0 and resamples else f"{v:.4f}")

    return fmt(1 / resamples if resamples else 0), fmt(min(1.0, m / resamples) if resamples else 0)


def _primary(setup: dict[str, Any], arm: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in setup["tests"] if t["label"] == arm["label"] and t["family"] == "primary")


def _null_text(setup: dict[str, Any]) -> str:
    ci = setup.get("null_false_positive_ci95") or [None, None]
    sim = (f"{_pct(setup['null_false_positive_rate'])} (Monte Carlo SE {100 * setup['null_false_positive_mc_se']:.2f} "
           f"points, 95% CI {_pct(ci[0])}-{_pct(ci[1])}; the highest over the compared checkpoints and the raw and "
           "smoothed noise models)") if ci[0] is not None else _pct(setup["null_false_positive_rate"])
    emp = "; ".join(f"step {c}: {_pct(v['share_p_below_0.05'])} of {v['tested']} splits"
                    + (" (sampled)" if v.get("sampled") else "")
                    for c, v in (setup.get("empirical_null") or {}).items() if v.get("share_p_below_0.05") is not None)
    return f"simulated {sim}" + (f"; empirical, directed splits of GRPO's seeds: {emp}" if emp else "")


def power_sentence(setup: dict[str, Any]) -> str:
    """What "not shown" is worth: the registered power code's probability of a verdict at each true effect."""
    curve = (setup.get("power") or {}).get("curve") or []
    if not curve:
        return ""
    shown = ", ".join(f"{p['rate']:.2f} at +{100 * p['effect']:.1f} points ({p['simulations']:,} simulations)"
                      for p in sorted(curve, key=lambda p: -p["effect"]))
    return (f"Power of this test on {setup['name']} (a method that far above GRPO's trajectory at the primary "
            f"checkpoint gets \"beats GRPO\" at Holm's first step among the 12 primary tests): {shown}. So \"not shown\" "
            "for an arm whose true effect is below 3 points says little.\n\n")


def _family_failed(setup: dict[str, Any], family: str = "primary") -> bool:
    return ((setup.get("amendment") or {}).get("control") or {}).get(family, {}).get("status") == amend.FAILED


def advice_markdown(combined: dict[str, Any]) -> str:
    """README's "Which method should I use?": from the verdicts alone, with their scope; the control first."""
    out = []
    for setup in combined["setups"]:
        scope = (f"one task ({setup['task']}) and one model of {setup['model_params']:,} parameters"
                 if setup.get("model_params") else f"one task ({setup['task']})")
        if _family_failed(setup):
            out.append(f"**{setup['name']}: the negative control beat GRPO** (a step-size change alone), so no "
                       "verdict of this set-up can be read and none of its methods is recommended from it.")
            continue
        alpha = setup.get("alpha", 0.05)
        arms = [a for a in _ordered(setup) if a.get("role") != "negative_control"]
        tests = {a["label"]: _primary(setup, a) for a in arms}
        rule = setup.get("platform_rule")
        voided = [a for a in arms if platform_rule.arm_status(rule, a["label"], "primary") == platform_rule.FAILED]
        wins = [a for a in arms if tests[a["label"]].get("p_holm") is not None and tests[a["label"]]["p_holm"] < alpha
                and a not in voided]
        none_ = [a for a in arms if tests[a["label"]].get("p") is None and a not in voided]
        rest = [a for a in arms if a not in wins and a not in none_ and a not in voided]

        def names(group):
            return ", ".join(f"`{a['label']}` ({_setting_text(setup, a)}, {100 * tests[a['label']]['effect']:+.1f} "
                             "points)" if tests[a["label"]].get("effect") is not None else f"`{a['label']}`"
                             for a in group) or "none"

        control = next((c for f, c in ((setup.get("amendment") or {}).get("control") or {}).items()
                        if f == "primary"), None)
        lead = ("The negative control did not beat GRPO" + (
            f" (its effect's 95% CI reaches {100 * control['ci_upper']:+.1f} points)" if control and
            control.get("ci_upper") is not None else "") + ". " if control and control["status"] == amend.PASSED else
            "The negative control could not be read, so these verdicts are not checked against step size. "
            if control else "")
        out.append(
            f"**On {setup['name']}** ({scope}; {len(setup['settings'][1]['seeds'])} seeds per arm): {lead}"
            f"Beat GRPO's own trajectory at the primary checkpoint: {names(wins)}. Not shown to: {names(rest)}."
            + (f" No verdict (seeds outside GRPO's pass@1 range): {names(none_)}." if none_ else "")
            + (f" Not interpretable (GRPO alone on their platform beat GRPO's trajectory, amendment 2): "
               f"{names(voided)}." if voided else "")
            + " Start from a method that beat GRPO; treat the others as untested on your task rather than as "
              "failures, and check any of them on your own held-out set (`exploration-trl confirm` with "
              "`task: train`).")
        out.append(power_sentence(setup).strip())
    return "\n\n".join(x for x in out if x) + "\n"


def advice_text(combined: dict[str, Any] | None) -> str:
    return ("Pending: this section is generated from the second protocol's verdicts (docs/confirmatory.json) when "
            "its last run is in.\n" if combined is None else advice_markdown(combined))


def summary_markdown(combined: dict[str, Any]) -> str:
    """The short table (README.md): per arm, control first, the primary checkpoint's effect with its 95% CI, Holm's
    p and the verdict, and 0.7.0's verdict for the same method."""
    rows, controls = [], ""
    for setup in combined["setups"]:
        controls += control_sentence(setup) + platform_rule.sentence(setup.get("platform_rule"))
        _, holm = _formats(setup, "primary")
        for arm in _ordered(setup):
            t = _primary(setup, arm)
            rows.append([setup["name"], ROLE_NAMES.get(arm.get("role"), arm.get("role") or ""), arm["label"],
                         f"{t['checkpoint']}: {_effect(t)}", holm(t.get("p_holm")), _verdict(setup, arm, t),
                         _earlier_text(setup, arm)])
    nulls = "; ".join(f"{s['name']}: {_null_text(s)}" for s in combined["setups"])
    controls += "".join(power_sentence(s) for s in combined["setups"])
    return controls + (_common.markdown_table(["set-up", "arm", "setting", "primary checkpoint: effect (pts) [95% CI]", "p_holm",
                                    "verdict", "0.7.0 (first protocol, primary checkpoint)"], rows)
            + f"\n\nNull false-positive rate of the test (GRPO against GRPO): {nulls}. Pre-registered in commit "
              f"{combined['protocol_commit'][:7]}; every run from a `git archive` of it.\n")


def tables_markdown(combined: dict[str, Any]) -> str:
    """The full tables (docs/confirmatory.md): every arm and checkpoint, the secondary analysis over seeds and
    number multisets, the selection, the nulls and the runs' provenance."""
    out = []
    for setup in combined["setups"]:
        prov = setup.get("provenance") or {}
        held = setup["heldout"]
        params = f"{setup['model_params']:,} parameters" if setup.get("model_params") else "model size not recorded"
        out.append(
            f"**{setup['name']}** ({setup['task']}; {params}). {held['n_problems']} held-out problems, "
            f"{'disjoint' if held['disjoint_from_training'] else 'NOT disjoint'} from training and from the "
            f"selection split. Every run: exploration-trl {prov.get('version')} at commit "
            f"{str(prov.get('commit'))[:7]} ({prov.get('origin')}, source hash {str(prov.get('source_hash'))[:12]}), "
            f"{prov.get('runs')} runs. Null false-positive rate: {_null_text(setup)}. Per-problem records: "
            f"{setup.get('per_problem_records')}.\n")
        out.append(control_sentence(setup) + platform_rule.sentence(setup.get("platform_rule")))
        out.append(power_sentence(setup))
        rows = []
        for arm in _ordered(setup):
            for t in (x for x in setup["tests"] if x["label"] == arm["label"]):
                p_text, holm = _formats(setup, t["family"])
                sm = t.get("seeds_and_multisets") or {}
                secondary = "-" if sm.get("effect") is None else f"{100 * sm['effect']:+.2f}, p {sm['p']:.3f}"
                rows.append([ROLE_NAMES.get(arm.get("role"), ""), arm["label"], _setting_text(setup, arm),
                             f"{t['checkpoint']} ({t['family']})", len(arm["seeds"]), _effect(t), p_text(t.get("p")),
                             holm(t.get("p_holm")), _verdict(setup, arm, t), secondary, _earlier_text(setup, arm)])
        out.append(_common.markdown_table(
            ["arm", "setting", "method", "checkpoint", "seeds", "effect (pts) [95% CI]", "p", "p_holm", "verdict",
             "seeds and multisets (secondary)", "0.7.0 (first protocol)"], rows))
        selection = setup.get("selection") or {}
        if selection.get("settings"):
            picks = []
            for label, s in selection["settings"].items():
                grid = ", ".join(f"{v['label']}: " + ("-" if v["effect"] is None else f"{100 * v['effect']:+.2f}")
                                 for v in s["grid"])
                picks.append(f"{label}: {s['chosen_label']} ({s['reason']}; {grid})")
            split = selection.get("split") or {}
            out.append(f"\nSelection (its own {split.get('n_problems', '?')} problems, GRPO seeds "
                       f"{selection.get('grpo_seeds')}, method seeds {selection.get('seeds')}, step "
                       f"{selection.get('checkpoint')}; effects in points): " + "; ".join(picks) + ".")
    return "\n".join(out) + "\n"


def block_text(combined: dict[str, Any] | None) -> str:
    return PENDING if combined is None else tables_markdown(combined)


def summary_text(combined: dict[str, Any] | None) -> str:
    return PENDING if combined is None else summary_markdown(combined)


def fill_verdicts(path, combined: dict[str, Any] | None) -> list[str]:
    """Fill the second protocol's blocks `path` has; returns which it filled."""
    from pathlib import Path

    from .analysis import fill_block

    text = Path(path).read_text()
    blocks = [(name, start, end, render) for name, start, end, render in (
        ("tables", BLOCK_START, BLOCK_END, block_text), ("summary", SUMMARY_START, SUMMARY_END, summary_text),
        ("advice", ADVICE_START, ADVICE_END, advice_text))
        if start in text]
    if not blocks:
        raise ValueError(f"{path}: has neither {BLOCK_START} nor {SUMMARY_START}; add one where the second "
                         "protocol's verdicts go")
    for _, start, end, render in blocks:
        fill_block(Path(path), render(combined), start, end)
    return [name for name, *_ in blocks]

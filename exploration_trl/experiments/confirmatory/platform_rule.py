"""Amendment 2 to the second protocol (configs/confirmatory/countdown3_v2_amendment2.yaml, docs/confirmatory.md): the
platform rule. Every run segment records its platform (`platform.py`, written by `launcher.py`); a platform is the
GRPO arm's only if it reproduces a committed GRPO record exactly; on every other platform that made method-arm
records, GRPO on the method arms' seeds (the platform control) is read by the registered test as if it were a method,
and its outcome decides, fixed in advance, how the verdicts of the arms made there are printed.

Like amendment 1 it only adds caution: no registered test, Holm family or p value changes; this module reads them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

FILES = {"countdown3_v2": Path("configs/confirmatory/countdown3_v2_amendment2.yaml")}
REFERENCE = "reference"
#: The folders under a run folder that amendment 2 adds.
PLATFORMS, CONTROLS = "platforms", "platform_control"
#: A family's platform-control status.
PASSED, FAILED, BELOW, NOT_CHECKED = "passed", "failed", "below", "not checked"
KEYS = ("amends", "protocol_commit", "date", "run_environment", "reference_platform", "same_platform_check",
        "platform_control", "not_interpretable_text", "masked_text", "not_checked_text")


def load(setup: str, root: Path) -> dict[str, Any] | None:
    """The amendment 2 of `setup` (None when it has none); a missing key is a one-line error."""
    import yaml

    path = FILES.get(setup)
    if path is None:
        return None
    found = yaml.safe_load((Path(root) / path).read_text())
    missing = [k for k in KEYS if k not in found]
    if missing:
        raise ValueError(f"{path}: missing key(s) {', '.join(missing)}")
    return found


# ---------------------------------------------------------------------------------------------- the configs
def _grpo_only(cfg: dict[str, Any], label: str, seeds: list[int], steps: list[int]) -> dict[str, Any]:
    """The registered config with no selection and one GRPO setting: what the frozen code runs for the check and the
    control (`--job confirm:<label>:<seed>`), with every other key (data, model, RL, evaluation) as registered."""
    out = copy.deepcopy(cfg)
    out.pop("selection", None)
    grpo = next(s for s in cfg["settings"] if s["label"] == cfg["baseline"])
    out["settings"] = [{"label": label, "method": grpo["method"], "seeds": list(seeds), "steps": list(steps)}]
    out["baseline"] = label
    return out


def check_config(cfg: dict[str, Any], amendment: dict[str, Any]) -> dict[str, Any]:
    c = amendment["same_platform_check"]
    return _grpo_only(cfg, c["label"], [int(c["seed"])], [int(s) for s in c["steps"]])


def control_config(cfg: dict[str, Any], amendment: dict[str, Any]) -> dict[str, Any]:
    c = amendment["platform_control"]
    return _grpo_only(cfg, c["label"], [int(s) for s in c["seeds"]], [int(s) for s in c["steps"]])


def control_folder(output: Path, platform_id: str) -> Path:
    return Path(output) / CONTROLS / platform_id


def check_folder(output: Path, platform_id: str) -> Path:
    return Path(output) / PLATFORMS / "checks" / platform_id


def segments_path(folder: Path, phase: str, label: str, seed: int) -> Path:
    return Path(folder) / PLATFORMS / phase / f"{label}__seed{seed}.jsonl"


# ------------------------------------------------------------------------------------------ the fingerprint
def fingerprint(record: dict[str, Any]) -> float | None:
    """A record's step-0 token entropy (its evaluation of the warm start): a function of the numeric platform."""
    row = next((r for r in record.get("rows", []) if r["step"] == 0), None)
    return None if row is None else row.get("token_entropy")


def compare_check(check: dict[str, Any], committed: dict[str, Any], steps: list[int]) -> dict[str, Any]:
    """Whether the check run reproduces the committed GRPO record exactly at `steps`: every problem's correct count
    and the token entropy. Returns the comparison, with the first step that differs."""
    first = None
    for s in steps:
        a = next((r for r in check["rows"] if r["step"] == s), None)
        b = next((r for r in committed["rows"] if r["step"] == s), None)
        same = (a is not None and b is not None and a["token_entropy"] == b["token_entropy"]
                and check["correct_counts"].get(str(s)) == committed["correct_counts"].get(str(s)))
        if not same:
            first = s
            break
    return {"reproduces": first is None, "first_differing_step": first, "steps": steps,
            "fingerprint": fingerprint(check), "reference_fingerprint": fingerprint(committed),
            "correct_samples": {str(s): [sum(check["correct_counts"].get(str(s)) or []),
                                         sum(committed["correct_counts"].get(str(s)) or [])] for s in steps}}


def segments(folder: Path, phase: str, label: str, seed: int) -> list[dict[str, Any]]:
    path = segments_path(folder, phase, label, seed)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def record_platforms(folder: Path, record: dict[str, Any], amendment: dict[str, Any]) -> list[str]:
    """The platforms a record was made on: the ids of its segments' starts; a record without a segment log is the
    reference platform's only if its step-0 entropy is the reference fingerprint of its phase (else a one-line error)."""
    phase = record.get("phase", "confirm")
    found = sorted({s["platform_id"] for s in segments(folder, phase, record["label"], record["seed"])
                    if s.get("event") == "start"})
    if found:
        return found
    want = amendment["reference_platform"]["fingerprint"][phase]
    got = fingerprint(record)
    if got != want:
        raise ValueError(f"run {phase}:{record['label']}:{record['seed']} has no platform log and its step-0 token "
                         f"entropy {got} is not the reference fingerprint {want}: its platform is unknown; rerun it "
                         "with the launcher (python -m exploration_trl.experiments.confirmatory.launcher)")
    return [REFERENCE]


# ------------------------------------------------------------------------------------------ at combine
#: Roles whose records need their platform's control (the GRPO arm and the step-size control are the reference).
METHOD_ROLES = ("tuned", "new", "replication")
#: Worst first: how a family's verdicts of an arm made on several platforms are printed.
SEVERITY = (FAILED, NOT_CHECKED, BELOW, PASSED)


def _first_platform(folder: Path, record: dict[str, Any], amendment: dict[str, Any]) -> str:
    starts = [s for s in segments(folder, record.get("phase", "confirm"), record["label"], record["seed"])
              if s.get("event") == "start"]
    return starts[0]["platform_id"] if starts else record_platforms(folder, record, amendment)[0]


def _records(folder: Path, sub: str = "") -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((Path(folder) / "runs" / sub).glob("*__seed*.json"))]


def _control_records(output: Path, pid: str, amendment: dict[str, Any], reference: dict[str, Any]) -> list[dict]:
    """The platform control's 18 finished records of platform `pid`, each checked like a protocol record."""
    c = amendment["platform_control"]
    folder = control_folder(output, pid)
    found = {r["seed"]: r for r in _records(folder) if r["label"] == c["label"]}
    missing = [s for s in c["seeds"] if not (found.get(s) or {}).get("finished")]
    if missing:
        raise ValueError(f"platform {pid}: its control has no finished record for seeds {missing} "
                         f"({folder}); run the launcher on that platform until it has")
    for seed in c["seeds"]:
        rec = found[seed]
        steps = {r["step"] for r in rec["rows"]}
        same = {k: (rec.get(k), reference.get(k)) for k in ("warm_start_checksum", "n_samples", "eval_seed",
                                                             "benchmark", "num_problems")}
        wrong = {k: v for k, v in same.items() if v[0] != v[1]}
        if (rec.get("provenance") or {}).get("source_hash") != (reference.get("provenance") or {}).get("source_hash"):
            wrong["source_hash"] = (rec.get("provenance"), reference.get("provenance"))
        if wrong or not set(c["steps"]) <= steps or rec.get("overrides"):
            raise ValueError(f"platform {pid}: control seed {seed} differs from the protocol's records in "
                             f"{sorted(wrong) or 'its steps or overrides'}; rerun it with the launcher")
        if _first_platform(folder, rec, amendment) != pid:
            raise ValueError(f"platform {pid}: control seed {seed} was started on another platform")
    return [found[s] for s in c["seeds"]]


def check_platforms(cfg: dict[str, Any], output: Path, amendment: dict[str, Any]) -> dict[str, Any]:
    """Every record's platform known, one fingerprint per platform, and each platform other than the reference that
    made method-arm records either reproduced GRPO (its check) or has a finished control. Returns, per platform, its
    runs, fingerprint, check and whether it needs its control read; per arm, its platforms."""
    output = Path(output)
    roles = {s["label"]: s.get("role") for s in cfg["settings"]}
    platforms: dict[str, dict[str, Any]] = {}
    arms: dict[str, set[str]] = {}
    for sub, phase in (("", "confirm"), ("selection", "selection")):
        for rec in _records(output, sub):
            pids = record_platforms(output, rec, amendment)
            if phase == "confirm":
                arms.setdefault(rec["label"], set()).update(pids)
                first = _first_platform(output, rec, amendment)
                p = platforms.setdefault(first, {"runs": 0, "fingerprints": set(), "method_arm_runs": 0})
                p["fingerprints"].add(fingerprint(rec))
            for pid in pids:
                p = platforms.setdefault(pid, {"runs": 0, "fingerprints": set(), "method_arm_runs": 0})
                p["runs"] += 1
                p["method_arm_runs"] += roles.get(rec["label"]) in METHOD_ROLES
    ref = amendment["reference_platform"]["fingerprint"]["confirm"]
    base = next(s for s in cfg["settings"] if s["label"] == cfg["baseline"])
    reference = json.loads((output / "runs" / f"{base['label']}__seed{base['seeds'][0]}.json").read_text())
    out = {}
    for pid, p in sorted(platforms.items()):
        prints = sorted(x for x in p["fingerprints"] if x is not None)
        if len(prints) > 1:
            raise ValueError(f"platform {pid}: its records' step-0 token entropies differ ({prints}): one platform id "
                             "covers two numeric platforms; the platform description misses what tells them apart")
        check_file = output / PLATFORMS / "checks" / f"{pid}.json"
        check = json.loads(check_file.read_text()) if check_file.is_file() else None
        same = pid == REFERENCE or bool(check and check["reproduces"])
        if same and prints and prints[0] != ref:
            raise ValueError(f"platform {pid}: counted as the GRPO arm's, but its step-0 entropy {prints[0]} is not "
                             f"the reference fingerprint {ref}")
        needs = p["method_arm_runs"] > 0 and not same
        if needs:
            controls = _control_records(output, pid, amendment, reference)
            prints_c = {fingerprint(r) for r in controls}
            if prints and prints_c != set(prints):
                raise ValueError(f"platform {pid}: its control's step-0 entropy {sorted(prints_c)} is not its method "
                                 f"arms' {prints}")
        out[pid] = {"runs": p["runs"], "method_arm_runs": p["method_arm_runs"],
                    "fingerprint": prints[0] if prints else None, "check": check, "same_as_reference": same,
                    "control_needed": needs}
    return {"platforms": out, "arms": {k: sorted(v) for k, v in sorted(arms.items())}}


def read_control(cfg: dict[str, Any], output: Path, amendment: dict[str, Any], pid: str) -> dict[str, Any]:
    """Per checkpoint family, the platform control of `pid` read by the registered test against the GRPO arm: its
    effect and 95% CI, the registered one-sided p (above GRPO's trajectory), the other one (below it: the share of
    resampled effects >= 0, a resample outside GRPO's range counted against "below") and the status."""
    import numpy as np

    from . import verdict

    output = Path(output)
    base = next(s for s in cfg["settings"] if s["label"] == cfg["baseline"])
    bsteps = sorted(base["steps"])

    def points(rec, steps):
        by = {r["step"]: (r["pass@1"], r["pass@n"]) for r in rec["rows"]}
        return np.array([by[s] for s in steps], float)

    grpo = np.stack([points(json.loads((output / "runs" / f"{base['label']}__seed{sd}.json").read_text()), bsteps)
                     for sd in base["seeds"]])
    reference = json.loads((output / "runs" / f"{base['label']}__seed{base['seeds'][0]}.json").read_text())
    controls = _control_records(output, pid, amendment, reference)
    b = cfg["bootstrap"]
    opts = {"resamples": int(b["resamples"]), "seed": int(b["seed"]), "correction": b.get("correction", "inflate_t"),
            "estimator": b.get("estimator", "mean_point"), "spread": float(b.get("spread", 1.0))}
    raw_alpha = float(amendment["platform_control"]["raw_alpha"])
    out = {}
    for checkpoint, family in sorted(amendment["platform_control"]["checkpoint_families"].items()):
        m = np.stack([points(r, [int(checkpoint)])[0] for r in controls])
        t = verdict.test(grpo, m, **opts)
        if t["p"] is None:
            p_below, status = None, NOT_CHECKED
        else:
            eff = verdict.bootstrap_effects(grpo, m, opts["resamples"], opts["seed"], opts["correction"],
                                            opts["estimator"], opts["spread"])
            p_below = float((np.isnan(eff) | (np.nan_to_num(eff, nan=1.0) >= 0)).mean())
            status = FAILED if t["p"] < raw_alpha else BELOW if p_below < raw_alpha else PASSED
        out[family] = {"checkpoint": int(checkpoint), "effect": t["effect"], "ci": t["ci"], "p": t["p"],
                       "p_below": p_below, "raw_alpha": raw_alpha, "status": status, "reason": t["reason"],
                       "seeds": len(controls), "method_mean": m.mean(axis=0).tolist()}
    return out


def section(cfg: dict[str, Any], output: Path, amendment: dict[str, Any], file: str) -> dict[str, Any]:
    """What the combine step keeps in the json: the platforms, each arm's platforms and each control's reading."""
    checked = check_platforms(cfg, output, amendment)
    for pid, p in checked["platforms"].items():
        if p["control_needed"]:
            p["control"] = read_control(cfg, output, amendment, pid)
        host = Path(output) / PLATFORMS / "hosts" / f"{pid}.json"
        p["description"] = json.loads(host.read_text()) if host.is_file() else None
    return {"file": file, "date": str(amendment["date"]), **checked,
            "texts": {k: amendment[k] for k in ("not_interpretable_text", "masked_text", "not_checked_text")}}


def arm_status(rule: dict[str, Any] | None, label: str, family: str) -> str:
    """The worst control status, in `family`, over the platforms `label`'s records were made on (`passed` when none
    of them needed a control)."""
    if not rule:
        return PASSED
    found = [rule["platforms"][pid]["control"][family]["status"] for pid in rule["arms"].get(label, [])
             if rule["platforms"].get(pid, {}).get("control_needed")]
    return min(found, key=SEVERITY.index, default=PASSED)


def apply(rule: dict[str, Any] | None, label: str, family: str, text: str, won: bool) -> str:
    """A verdict as amendment 2 prints it."""
    status = arm_status(rule, label, family)
    if status == FAILED:
        return f"**{rule['texts']['not_interpretable_text']}**"
    if status == NOT_CHECKED:
        return f"{text} ({rule['texts']['not_checked_text']})"
    if status == BELOW and not won:
        return f"{text} ({rule['texts']['masked_text']})"
    return text


def sentence(rule: dict[str, Any] | None) -> str:
    """The platforms, first in every table: which made which runs, and each control's reading both ways."""
    if not rule:
        return ""
    parts = []
    for pid, p in rule["platforms"].items():
        d = (p.get("description") or {}).get("cpu") or {}
        name = "the GRPO arm's platform (by its fingerprint)" if pid == REFERENCE else \
            f"`{pid}` ({d.get('model_name', '?')}, family {d.get('family', '?')} model {d.get('model', '?')})"
        if not p["control_needed"]:
            why = "" if pid == REFERENCE else " (it reproduced GRPO seed 100 exactly)" if p["same_as_reference"] \
                else " (no method-arm run)"
            parts.append(f"{name}: {p['runs']} runs{why}")
            continue
        reads = []
        for family, c in p["control"].items():
            if c["status"] == NOT_CHECKED:
                reads.append(f"{family} ({c['checkpoint']}): could not be read")
                continue
            reads.append(f"{family} ({c['checkpoint']}): effect {100 * c['effect']:+.2f} points, 95% CI "
                         f"[{100 * c['ci'][0]:+.1f}, {100 * c['ci'][1]:+.1f}], p above {c['p']:.4f}, p below "
                         f"{c['p_below']:.4f}: {c['status']}")
        parts.append(f"{name}: {p['runs']} runs, {p['method_arm_runs']} of them method-arm runs; its platform "
                     "control (GRPO on seeds 100-117): " + "; ".join(reads))
    return (f"**Platforms** (amendment 2 of {rule['date']}, `{rule['file']}`): " + "; ".join(parts) + ".\n\n")

"""The combine step's integrity checks of a second-protocol run folder, before any verdict is published. Each
failure is one `IntegrityError` line that names what is wrong:

- `selection.json` equals the selection recomputed from the selection records by the registered rule
  (`protocol_v2.choose`);
- every tuned arm's records ran the published setting with the selected value;
- every record (selection and confirmation) names the protocol commit and one source hash;
- every (setting, seed) of the protocol has exactly one finished record, and no record is outside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import protocol_v2, runner

SELECTION_FILE = "selection.json"


class IntegrityError(ValueError):
    """A run folder that must not be published."""


def _records(output: Path, phase: str) -> dict[tuple[str, int], dict]:
    return runner.collect(output, phase)


def check_selection(cfg: dict[str, Any], output: Path, selection: dict[str, Any]) -> None:
    recomputed = protocol_v2.choose(cfg, _records(output, "selection"))
    for label, s in recomputed["settings"].items():
        got = (selection.get("settings") or {}).get(label)
        if got is None or got["chosen"] != s["chosen"]:
            raise IntegrityError(f"{SELECTION_FILE}: {label} chose {None if got is None else got['chosen']} but the "
                                 f"registered rule on the selection records chooses {s['chosen']}")
        effects = [v["effect"] for v in s["grid"]]
        if [v["effect"] for v in got["grid"]] != effects:
            raise IntegrityError(f"{SELECTION_FILE}: {label}'s grid effects {[v['effect'] for v in got['grid']]} "
                                 f"differ from the recomputed {effects}")


def check_counts(cfg: dict[str, Any], output: Path, chosen: dict[str, dict]) -> dict[str, int]:
    """Every planned run has one finished record, none is extra; returns the finished count per arm."""
    expected = {(j["phase"], j["label"], j["seed"]): j for j in
                protocol_v2.selection_jobs(cfg) + protocol_v2.confirm_jobs(cfg, chosen)}
    found = {("selection", *k): r for k, r in _records(output, "selection").items()}
    found.update({("confirm", *k): r for k, r in _records(output, "confirm").items()})
    extra = sorted(f"{p}:{lab}:{sd}" for p, lab, sd in set(found) - set(expected))
    if extra:
        raise IntegrityError(f"records outside the protocol: {', '.join(extra[:5])}")
    missing = sorted(f"{p}:{lab}:{sd}" for key in expected for p, lab, sd in [key]
                     if key not in found or not found[key].get("finished"))
    if missing:
        raise IntegrityError(f"{len(missing)} of {len(expected)} runs have no finished record (e.g. "
                             f"{', '.join(missing[:5])}); run the protocol until every run has finished")
    counts: dict[str, int] = {}
    for phase, label, _ in expected:
        counts[f"{phase}:{label}"] = counts.get(f"{phase}:{label}", 0) + 1
    return counts


def check_settings(cfg: dict[str, Any], output: Path, chosen: dict[str, dict]) -> None:
    """Each confirmation record ran its planned overrides (a tuned arm: published + the selected value)."""
    planned = {(j["label"], j["seed"]): j["overrides"] for j in protocol_v2.confirm_jobs(cfg, chosen)}
    for (label, seed), rec in _records(output, "confirm").items():
        want = planned.get((label, seed))
        if want is not None and (rec.get("overrides") or {}) != want:
            raise IntegrityError(f"run {label}:{seed} ran overrides {rec.get('overrides')} but the protocol and "
                                 f"{SELECTION_FILE} say {want}")


def check_provenance(output: Path, protocol_sha: str) -> dict[str, Any]:
    """Every record's commit is the protocol commit, and all share one source hash."""
    hashes: dict[str, list[str]] = {}
    for phase in ("selection", "confirm"):
        for (label, seed), rec in _records(output, phase).items():
            prov = rec.get("provenance") or {}
            if prov.get("commit") != protocol_sha:
                raise IntegrityError(f"run {phase}:{label}:{seed} names commit {prov.get('commit')}, not the protocol "
                                     f"commit {protocol_sha} (--protocol-commit)")
            hashes.setdefault(str(prov.get("source_hash")), []).append(f"{phase}:{label}:{seed}")
    if len(hashes) != 1:
        parts = "; ".join(f"{h[:12]}: {len(v)} runs (e.g. {v[0]})" for h, v in hashes.items())
        raise IntegrityError(f"records of more than one source hash: {parts}")
    return {"commit": protocol_sha, "source_hash": next(iter(hashes))}


def check(cfg: dict[str, Any], output: Path, protocol_sha: str) -> dict[str, Any]:
    """All four checks on the run folder `output` of protocol `cfg`; returns what was checked (for the json)."""
    output = Path(output)
    path = output / SELECTION_FILE
    if not path.is_file():
        raise IntegrityError(f"{path}: missing; the selection is decided before any confirmation run")
    selection = json.loads(path.read_text())
    check_selection(cfg, output, selection)
    chosen = {label: s["chosen"] for label, s in selection["settings"].items()}
    counts = check_counts(cfg, output, chosen)
    check_settings(cfg, output, chosen)
    prov = check_provenance(output, protocol_sha)
    return {"selection_recomputed": True, "settings_match_selection": True, **prov,
            "finished_runs_per_arm": counts, "runs": sum(counts.values())}

"""The combine step's integrity checks of a second-protocol run folder, before any verdict is published. Each
failure is one `IntegrityError` line that names the run (or file), what is wrong and how to fix it:

- one file per run, named `<label>__seed<s>.json` after its content (`runner.collect` keys records by content, so
  a second file of one run would silently replace the first);
- every record has finished, ran its phase's benchmark and evaluation (samples, seed, problems) and holds a row
  and per-problem counts at every planned step (the analysis would otherwise fail with a bare KeyError, or worse,
  mix evaluations);
- `selection.json` equals the selection recomputed from the selection records by the registered rule
  (`protocol.choose`);
- every (setting, seed) of the protocol has exactly one finished record, and no record is outside it;
- every tuned arm's records ran the published setting with the selected value;
- every record (selection and confirmation) names the protocol commit and one source hash;
- every record trained from the folder's warm start (`warm_start/warm_start.json`);
- `result.json` is the analysis of these records: its provenance, warm start, and the deterministic numbers the
  records give (each test's effect and method mean, each setting's trajectory) are recomputed.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from . import protocol, provenance, runner, verdict
from .records import points_at

SELECTION_FILE = "selection.json"
WARM_START_FILE = Path("warm_start") / "warm_start.json"
TOLERANCE = 1e-12


class IntegrityError(ValueError):
    """A run folder that must not be published."""


def _records(output: Path, phase: str) -> dict[tuple[str, int], dict]:
    return runner.collect(output, phase)


def _in_order(files: dict) -> list:
    """`files`' items by phase, label and seed (a number)."""
    return sorted(files.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), str(kv[0][2]).rjust(12)))


def _rerun(key: tuple[str, str, int]) -> str:
    job = ":".join(map(str, key))
    return f"remove its record and run it again (`exploration-trl confirm --config ... --job {job}`)"


# ------------------------------------------------------------------------------------------ the record files
def check_files(output: Path) -> dict[tuple[str, str, int], tuple[Path, dict]]:
    """`{(phase, label, seed): (file, record)}` of every record file; refuses two files of one run and a file whose
    name is not its content's `<label>__seed<seed>.json`."""
    found: list[tuple[tuple[str, str, int], Path, dict]] = []
    for phase, folder in (("selection", Path(output, "runs", "selection")), ("confirm", Path(output, "runs"))):
        for path in sorted(folder.glob("*__seed*.json")):
            try:
                rec = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise IntegrityError(f"{path.relative_to(output)}: not valid JSON ({e}); remove it and run that run "
                                     "again") from None
            found.append(((phase, rec.get("label"), rec.get("seed")), path, rec))
    out: dict[tuple[str, str, int], tuple[Path, dict]] = {}
    for key, path, rec in found:
        if key in out:
            raise IntegrityError(f"{out[key][0].relative_to(output)} and {path.relative_to(output)} both hold run "
                                 f"{':'.join(map(str, key))}; keep the one the protocol's run wrote, remove the other")
        out[key] = (path, rec)
    for key, path, _ in found:
        label, _, seed = path.stem.rpartition("__seed")
        if (label, seed) != (str(key[1]), str(key[2])):
            raise IntegrityError(f"{path.relative_to(output)} holds run {':'.join(map(str, key))}, but its name says "
                                 f"{label}:{seed}; a record is <label>__seed<seed>.json: rename it")
    return out


def records_digest(output: Path) -> str:
    """sha256 over every record file's exact bytes, in (phase, label, seed) order, each after its `phase:label:seed`
    line: names the records a verdict was published from (a later change to any of them changes it)."""
    h = hashlib.sha256()
    for key, (path, _) in _in_order(check_files(Path(output))):
        h.update(f"{':'.join(map(str, key))}\n".encode())
        h.update(path.read_bytes())
        h.update(b"\n")
    return h.hexdigest()


def check_records(cfg: dict[str, Any], files: dict[tuple[str, str, int], tuple[Path, dict]]) -> None:
    """Each record finished, ran its phase's benchmark with the registered evaluation, and holds one row and one
    list of per-problem counts per planned step (records outside the protocol are `check_counts`'s)."""
    planned = {(j["phase"], j["label"], j["seed"]): j
               for j in protocol.selection_jobs(cfg) + protocol.confirm_jobs(cfg, None)}
    ev = cfg["eval"]
    for key, (path, rec) in _in_order(files):
        phase, run = key[0], f"run {':'.join(map(str, key))} ({path.name})"
        if not rec.get("finished"):
            raise IntegrityError(f"{run} has not finished (finished: {rec.get('finished')}, last step "
                                 f"{rec.get('last_step')}); resume it (`exploration-trl confirm --config ... --job "
                                 f"{':'.join(map(str, key))}`) until it has")
        if key not in planned:
            continue
        problems = int((cfg["heldout"] if phase == "confirm" else cfg["selection"])["num_problems"])
        split = "heldout" if phase == "confirm" else "selection"
        want = {"phase": phase, "benchmark": f"{cfg['name']}_{split}", "n_samples": int(ev["n_samples"]),
                "eval_seed": int(ev["seed"]), "num_problems": problems}
        for field, value in want.items():
            if rec.get(field) != value:
                raise IntegrityError(f"{run} has {field} {rec.get(field)!r} but the protocol's {phase} runs have "
                                     f"{value!r}; {_rerun(key)}")
        steps = sorted({int(s) for s in planned[key]["steps"]})
        rows = sorted(int(r["step"]) for r in rec.get("rows") or [])
        if rows != steps:
            raise IntegrityError(f"{run} has evaluation rows at steps {rows}, but its planned steps are {steps} (one "
                                 f"row each); {_rerun(key)}")
        counts = rec.get("correct_counts")
        if not isinstance(counts, dict):
            raise IntegrityError(f"{run} has no correct_counts (the per-problem counts the analysis reads); "
                                 f"{_rerun(key)}")
        for s in steps:
            got = counts.get(str(s))
            if not isinstance(got, list) or len(got) != problems:
                what = "missing" if got is None else f"{len(got)} counts" if isinstance(got, list) else repr(got)
                raise IntegrityError(f"{run}'s correct_counts at step {s}: {what}, not one count for each of its "
                                     f"{problems} problems; {_rerun(key)}")


# ----------------------------------------------------------------------------------------- the protocol's plan
def check_selection(cfg: dict[str, Any], output: Path, selection: dict[str, Any]) -> None:
    recomputed = protocol.choose(cfg, _records(output, "selection"))
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
                protocol.selection_jobs(cfg) + protocol.confirm_jobs(cfg, chosen)}
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
    planned = {(j["label"], j["seed"]): j["overrides"] for j in protocol.confirm_jobs(cfg, chosen)}
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


def check_warm_start(output: Path, files: dict[tuple[str, str, int], tuple[Path, dict]]) -> str:
    """Every record trained from the folder's warm start; returns its checksum."""
    path = Path(output) / WARM_START_FILE
    if not path.is_file():
        raise IntegrityError(f"{path}: missing; copy the warm start the runs trained from (its warm_start.json) into "
                             "the run folder")
    checksum = json.loads(path.read_text()).get("checksum")
    for key, (file, rec) in _in_order(files):
        if rec.get("warm_start_checksum") != checksum:
            raise IntegrityError(f"run {':'.join(map(str, key))} ({file.name}) trained from warm start "
                                 f"{str(rec.get('warm_start_checksum'))[:12]}, not this folder's {str(checksum)[:12]} "
                                 f"({WARM_START_FILE}); {_rerun(key)} from this warm start")
    return checksum


# ------------------------------------------------------------------------------------------------ result.json
def _differs(got: Any, want: Any) -> bool:
    """Numbers (or nested lists of them) further apart than `TOLERANCE`; None and NaN (outside GRPO's range) agree."""
    if isinstance(want, list):
        return not isinstance(got, list) or len(got) != len(want) or any(map(_differs, got, want))
    want = None if want is None or math.isnan(want) else want
    got = None if isinstance(got, float) and math.isnan(got) else got
    if got is None or want is None:
        return (got is None) != (want is None)
    return not isinstance(got, (int, float)) or abs(got - want) > TOLERANCE


def check_result(cfg: dict[str, Any], output: Path, result: dict[str, Any], warm_start_checksum: str) -> None:
    """`result` (result.json) was analysed from these records: its provenance and warm start are theirs, and each
    test's effect and method mean and each setting's trajectory are what `analysis.analyse` computes from them
    (cheap and deterministic, unlike the bootstrap and the nulls)."""
    redo = "write the verdict again from these records (`exploration-trl confirm --config ... --analyse-only`)"
    records, selection = _records(output, "confirm"), _records(output, "selection")
    every = {**records, **{("selection:" + k[0], k[1]): v for k, v in selection.items()}}
    try:
        origin = provenance.check_same(every, (cfg.get("provenance") or {}).get("declared"))
    except ValueError as e:
        raise IntegrityError(str(e)) from None
    if result.get("provenance") != origin:
        raise IntegrityError(f"{runner.RESULT_FILE}: provenance {result.get('provenance')} is not the records' "
                             f"{origin}; {redo}")
    got = (result.get("heldout") or {}).get("warm_start_checksum")
    if got != warm_start_checksum:
        raise IntegrityError(f"{runner.RESULT_FILE}: heldout.warm_start_checksum {str(got)[:12]} is not the records' "
                             f"{warm_start_checksum[:12]}; {redo}")
    base = protocol.setting(cfg, cfg["baseline"])
    bsteps = sorted(base["steps"])
    grpo = np.stack([points_at(records[(base["label"], sd)], bsteps) for sd in base["seeds"]])
    by_label = {s["label"]: s for s in cfg["settings"]}
    wanted = {(s["label"], c) for s in cfg["settings"] if s is not base for c in protocol.checkpoints_of(cfg, s)}
    tests = {(t.get("label"), t.get("checkpoint")): t for t in result.get("tests") or []}
    if set(tests) != wanted:
        odd = sorted(f"{a}@{b}" for a, b in set(tests) ^ wanted)
        raise IntegrityError(f"{runner.RESULT_FILE}: its tests are not the protocol's (differ at {', '.join(odd[:5])})"
                             f"; {redo}")
    for (label, c), t in sorted(tests.items()):
        m = np.stack([points_at(records[(label, sd)], [c])[0] for sd in by_label[label]["seeds"]])
        for field, want in (("effect", verdict.point_effect(grpo, m)), ("method_mean", m.mean(axis=0).tolist())):
            if _differs(t.get(field), want):
                raise IntegrityError(f"{runner.RESULT_FILE}: {label} at checkpoint {c}: {field} {t.get(field)} but "
                                     f"the checked records give {want}; {redo}")
    settings = {s.get("label"): s for s in result.get("settings") or []}
    for label, s in by_label.items():
        steps = sorted(s["steps"])
        want = np.stack([points_at(records[(label, sd)], steps) for sd in s["seeds"]]).mean(axis=0).tolist()
        got = (settings.get(label) or {}).get("trajectory_mean")
        if _differs(got, want):
            raise IntegrityError(f"{runner.RESULT_FILE}: {label}'s trajectory_mean at steps {steps} is {got} but the "
                                 f"checked records give {want}; {redo}")


def check(cfg: dict[str, Any], output: Path, protocol_sha: str, result: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    """Every check on the run folder `output` of protocol `cfg` and its `result` (default: its result.json);
    returns what was checked (for the json), with the records' digest (`records_digest`)."""
    output = Path(output)
    path = output / SELECTION_FILE
    if not path.is_file():
        raise IntegrityError(f"{path}: missing; the selection is decided before any confirmation run")
    files = check_files(output)
    check_records(cfg, files)
    selection = json.loads(path.read_text())
    check_selection(cfg, output, selection)
    chosen = {label: s["chosen"] for label, s in selection["settings"].items()}
    counts = check_counts(cfg, output, chosen)
    check_settings(cfg, output, chosen)
    prov = check_provenance(output, protocol_sha)
    warm = check_warm_start(output, files)
    if result is None:
        if not (output / runner.RESULT_FILE).is_file():
            raise IntegrityError(f"{output / runner.RESULT_FILE}: missing; write the verdict first (--analyse-only)")
        result = json.loads((output / runner.RESULT_FILE).read_text())
    check_result(cfg, output, result, warm)
    return {"selection_recomputed": True, "settings_match_selection": True, **prov,
            "finished_runs_per_arm": counts, "runs": sum(counts.values()), "records_checked": True,
            "warm_start_checksum": warm, "result_recomputed": True, "records_digest": records_digest(output)}

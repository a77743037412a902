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

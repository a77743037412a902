"""The second protocol's verdicts as model cards print them: `exploration_trl/data/second_protocol_verdicts.json`,
package data that `exploration_trl.hub.protocol_verdict` reads (the hub cannot import this package: imports only go
down). Amendment 1 says model cards print "not interpretable" where the negative control beat GRPO; a card prints
the verdict of its method's arm, so the file carries each method arm's verdict sentence exactly as
`combine_v2._verdict` prints it in the README and the docs' tables (both amendments applied), beside its effect, CI,
Holm p and the scope of the test.

`exploration-trl confirm --combine ... --protocol-commit 4e6b608` writes it (`publish.combine`) beside
`docs/confirmatory.json`'s `second_protocol`; until then the file does not exist and cards say there is no verdict
yet. `tests/test_card_verdicts.py` checks that the committed file is `from_combined` of the committed json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...hub.protocol_verdict import FILE, SCHEMA
from .. import _common
from . import combine_v2

#: Where the file lies in a checkout, relative to its root.
PACKAGE_PATH = Path("exploration_trl") / "data" / FILE


def _baseline(setup: dict[str, Any]) -> dict[str, Any]:
    label = setup.get("baseline") or setup["settings"][0]["label"]
    return next(s for s in setup["settings"] if s["label"] == label)


def _arm(setup: dict[str, Any], arm: dict[str, Any]) -> dict[str, Any]:
    t = combine_v2._primary(setup, arm)
    _, holm = combine_v2._formats(setup, "primary")
    verdict = combine_v2._verdict(setup, arm, t)
    return {"label": arm["label"], "role": arm.get("role"), "method": arm["method"],
            "overrides": dict(arm.get("overrides") or {}), "setting": combine_v2._setting_text(setup, arm),
            "seeds": len(arm["seeds"]), "checkpoint": t["checkpoint"], "effect": t.get("effect"),
            "ci": None if t.get("ci") is None else list(t["ci"]), "p_holm": t.get("p_holm"),
            "effect_text": combine_v2._effect(t), "p_holm_text": holm(t.get("p_holm")), "verdict": verdict,
            "not_shown": "not shown to beat GRPO" in verdict}


def from_combined(section: dict[str, Any]) -> dict[str, Any]:
    """What cards print, from `docs/confirmatory.json`'s `second_protocol` section: per set-up its scope and, per
    method arm (neither the GRPO baseline nor the negative control), its primary test and verdict sentence."""
    setups = []
    for setup in section["setups"]:
        baseline = _baseline(setup)
        arms = [a for a in combine_v2._ordered(setup)
                if a["label"] != baseline["label"] and a.get("role") != "negative_control"]
        setups.append({
            "name": setup["name"], "task": setup.get("task"), "model_params": setup.get("model_params"),
            "alpha": setup.get("alpha", 0.05),
            "baseline": {"label": baseline["label"], "method": baseline["method"], "seeds": len(baseline["seeds"])},
            "power": combine_v2.power_sentence(setup).strip() or None,
            "arms": [_arm(setup, a) for a in arms]})
    return {"schema": SCHEMA, "source": "docs/confirmatory.json (second_protocol)",
            "protocol_commit": section["protocol_commit"], "setups": setups}


def write(section: dict[str, Any], path: str | Path) -> Path:
    """Write `from_combined(section)` to `path` (JSON); returns the path."""
    return _common.write_json(path, from_combined(section))


def package_path(write_path: str | Path) -> Path | None:
    """The package-data file of the checkout whose `docs/confirmatory.json` is `write_path` (the combine step's
    --write), or None when `write_path` is not a checkout's `docs/confirmatory.json` (a copy elsewhere, a test): the
    packaged verdicts follow only the published json."""
    write_path = Path(write_path).resolve()
    root = write_path.parent.parent
    if write_path.name != "confirmatory.json" or write_path.parent.name != "docs" or \
            not (root / "exploration_trl").is_dir():
        return None
    return root / PACKAGE_PATH

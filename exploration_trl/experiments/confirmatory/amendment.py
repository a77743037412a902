"""Amendment 1 to the second protocol (configs/confirmatory/countdown3_v2_amendment1.yaml, docs/confirmatory.md):
the negative control is also read at raw alpha, and a control that beats GRPO makes every verdict of its checkpoint
family "not interpretable". It only adds caution: the registered test, its Holm families and its p values are
untouched; this module reads them and says which verdicts stand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The amendment of each set-up, by its name (beside the registered YAML; read by the combine step).
FILES = {"countdown3_v2": Path("configs/confirmatory/countdown3_v2_amendment1.yaml")}
#: A family's control status.
PASSED, FAILED, NOT_CHECKED = "passed", "failed", "not checked"


def load(setup: str, root: Path) -> dict[str, Any] | None:
    """The amendment of `setup` (None when it has none)."""
    import yaml

    path = FILES.get(setup)
    if path is None:
        return None
    amendment = yaml.safe_load((root / path).read_text())
    for key in ("amends", "date", "control", "not_interpretable_text", "not_checked_text"):
        if key not in amendment:
            raise ValueError(f"{path}: missing key '{key}'")
    return amendment


def control_reading(setup: dict[str, Any], amendment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per checkpoint family (`primary`, `middle`), the control's test read as the amendment says: its effect with
    the upper end of its 95% CI, its raw one-sided p against `raw_alpha`, Holm's p against the set-up's alpha, and
    the status (`passed`: neither below; `failed`: either below; `not checked`: no effect could be read)."""
    label = amendment["control"]["label"]
    raw_alpha, alpha = float(amendment["control"]["raw_alpha"]), float(setup.get("alpha", 0.05))
    out = {}
    for t in setup["tests"]:
        if t["label"] != label:
            continue
        if t.get("p") is None:
            status = NOT_CHECKED
        else:
            failed = t["p"] < raw_alpha or (t.get("p_holm") is not None and t["p_holm"] < alpha)
            status = FAILED if failed else PASSED
        out[t["family"]] = {"checkpoint": t["checkpoint"], "effect": t.get("effect"),
                            "ci_upper": None if t.get("ci") is None else t["ci"][1], "p": t.get("p"),
                            "p_holm": t.get("p_holm"), "raw_alpha": raw_alpha, "status": status}
    if not out:
        raise ValueError(f"amendment: the set-up {setup['name']} has no test of the control {label!r}; the "
                         "amendment names another label than the protocol")
    return out


def verdict_override(amendment: dict[str, Any], reading: dict[str, dict[str, Any]], family: str) -> str | None:
    """What replaces (`failed`) or follows (`not checked`) a verdict of `family`; None when the control passed."""
    status = (reading.get(family) or {}).get("status", NOT_CHECKED)
    if status == FAILED:
        return amendment["not_interpretable_text"]
    if status == NOT_CHECKED:
        return amendment["not_checked_text"]
    return None

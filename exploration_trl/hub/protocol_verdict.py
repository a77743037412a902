"""The card's "Does it beat GRPO?" section: the verdict of the pre-registered comparison against GRPO (the second
confirmatory protocol, docs/confirmatory.md) for the card's method, with the scope of that test.

The verdicts come from package data, `exploration_trl/data/second_protocol_verdicts.json`, which
`exploration-trl confirm --combine` writes from `docs/confirmatory.json`'s `second_protocol`
(`exploration_trl.experiments.confirmatory.card_verdicts`; this package sits below it and reads only the file). Each
verdict sentence is the one the README and the docs print, so amendment 1's "not interpretable" (the negative
control beat GRPO) and amendment 2's platform caveats come through verbatim. Before publication the file does not
exist and the section says there is no verdict yet.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from .. import PROJECT_URL

__all__ = ["load_verdicts", "verdict_section"]

FILE = "second_protocol_verdicts.json"
SCHEMA = "exploration_trl/second_protocol_verdicts/v1"
BASELINE = "grpo"
DOC = f"[docs/confirmatory.md]({PROJECT_URL}/blob/main/docs/confirmatory.md#the-second-protocol)"
#: Before publication the card cannot tell an arm from another method without naming methods here (the registry is
#: the only list of methods): it says that no verdict is published yet, and where the arms are listed.
PENDING = (f"The pre-registered comparison against GRPO (the second protocol, {DOC}) has no published verdict yet: "
           "its runs are under way, and that page lists its arms. Once it is published, this card re-rendered with a "
           "release that has it (`exploration-trl push`) prints the verdict here.")


def verdicts_file():
    """The packaged verdicts (a `Traversable`; it may not exist)."""
    return resources.files("exploration_trl").joinpath("data").joinpath(FILE)


def load_verdicts() -> dict[str, Any] | None:
    """The packaged verdicts, or None before the second protocol is published."""
    found = verdicts_file()
    if not found.is_file():
        return None
    data = json.loads(found.read_text(encoding="utf-8"))
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{FILE}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    return data


def _arms(data: dict[str, Any] | None, method: str) -> list[tuple[dict, dict]]:
    return [(s, a) for s in (data or {}).get("setups", []) for a in s["arms"] if a["method"] == method]


def _arm_line(setup: dict[str, Any], arm: dict[str, Any]) -> str:
    effect = ("" if arm.get("effect") is None else
              f" Effect, in points of pass@64 above GRPO's trajectory at the arm's pass@1 [95% CI]: "
              f"{arm['effect_text']}; Holm-adjusted p: {arm['p_holm_text']}.")
    setting = "default settings" if arm["setting"] == arm["method"] else arm["setting"]
    return (f"arm `{arm['label']}` ({setting}) on `{setup['name']}`, at step {arm['checkpoint']}: "
            f"{arm['verdict']}.{effect}")


def _scope(setup: dict[str, Any], arms: list[dict[str, Any]], commit: str) -> str:
    seeds = sorted({a["seeds"] for a in arms})
    model = (f"one model of {setup['model_params']:,} parameters" if setup.get("model_params")
             else "one model")
    return (f"Scope of `{setup['name']}`: one task ({setup.get('task') or setup['name']}), {model}, "
            f"{'/'.join(map(str, seeds))} seeds per arm ({setup['baseline']['seeds']} for GRPO), pre-registered in "
            f"commit {commit[:7]}; on your task it is untested. This card's model was trained with its own data and "
            "settings, not the arm's.")


def _published(found: list[tuple[dict, dict]], commit: str) -> list[str]:
    """The lines after the verdicts: each set-up's scope, and what "not shown" is worth there."""
    out = []
    for name in dict.fromkeys(s["name"] for s, _ in found):
        setup = next(s for s, _ in found if s["name"] == name)
        arms = [a for s, a in found if s["name"] == name]
        out.append(_scope(setup, arms, commit))
        if setup.get("power") and any(a.get("not_shown") for a in arms):
            out.append(setup["power"])
    return out


def _not_an_arm(what: str, data: dict[str, Any] | None) -> str:
    return (f"{what} {'was' if data else 'is'} not an arm of the pre-registered comparison against GRPO (the second "
            f"protocol, {DOC}), so that comparison has no verdict for it, and will not have one.")


def verdict_section(method: str, still: bool = False) -> str:
    """Markdown for the card of a model trained with `method` (canonical, e.g. `progrpo+casp`; `still`: with the STILL
    shapings): its arm's verdict with effect, CI, Holm p and scope; for a composition (or with STILL), that it was
    not tested and its components' verdicts; else why there is none (yet)."""
    data = load_verdicts()
    commit = (data or {}).get("protocol_commit", "4e6b608")
    parts = method.split("+")
    if method == BASELINE and not still:
        return (f"GRPO is the baseline of the pre-registered comparisons ({DOC}): every method arm is tested against "
                "it, so there is no verdict for GRPO itself.")
    if len(parts) == 1 and not still:
        found = _arms(data, method)
        if found:
            lines = [f"In the pre-registered comparison against GRPO (the second protocol, {DOC}), `{method}` was "
                     "tested as:", ""] + [f"- {_arm_line(s, a)}" for s, a in found]
            return "\n".join(lines) + "\n\n" + "\n\n".join(_published(found, commit))
        return PENDING if data is None else _not_an_arm(f"`{method}`", data)
    if data is None:
        return PENDING
    what = f"`{method}`" + (" with the STILL shapings" if still else "")
    text = _not_an_arm(what, data) + (" The composition itself was not tested." if len(parts) > 1 else "")
    found = [(p, s, a) for p in parts for s, a in _arms(data, p)]
    if found:
        alone = "each trained alone" + (", without the STILL shapings" if still else "")
        text += (f" Its components' verdicts, {alone}:" if len(parts) > 1 else
                 f" The verdict of `{method}` alone, without the STILL shapings:") + "\n\n" + "\n".join(
            f"- `{p}`: {_arm_line(s, a)}" for p, s, a in found)
        text += "\n\n" + "\n\n".join(_published([(s, a) for _, s, a in found], commit))
    return text.strip()

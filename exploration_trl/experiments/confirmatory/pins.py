"""What decides how the second protocol's verdicts are printed, pinned to the commits that registered it, so that no
one can change it after seeing results (configs/confirmatory/countdown3_v2_pins.yaml).

The frozen archive fixes the runs and the registered analysis; the amendments, the code that applies them
(`amendment.py`, `platform_rule.py`, `combine_v2.py`) and the words of a verdict (`analysis.verdict_of`) are read
from the working tree at combine. Each is pinned to a commit: a whole file must be byte for byte as that commit has
it, a function (`path::name`) must have that commit's source. Every pinned commit must precede the first commit
that added a method-arm record (`tests/test_confirmatory_v2_platform.py` and the combine step check both).
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from typing import Any

FILE = Path("configs/confirmatory/countdown3_v2_pins.yaml")


def load(root: Path) -> dict[str, str]:
    import yaml

    return {str(k): str(v) for k, v in yaml.safe_load((Path(root) / FILE).read_text())["pins"].items()}


def _show(root: Path, commit: str, path: str) -> str | None:
    shown = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=root, capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def function_source(text: str, name: str) -> str | None:
    """The source of the top-level function `name` in a module's `text` (None when it has none)."""
    tree = ast.parse(text)
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    return None if node is None else ast.get_source_segment(text, node)


def check(root: Path, pins: dict[str, str] | None = None) -> dict[str, str]:
    """Every pin holds in the working tree of `root`; returns the pins. A broken one is a one-line `ValueError`."""
    root = Path(root)
    pins = load(root) if pins is None else pins
    for target, commit in pins.items():
        path, _, name = target.partition("::")
        registered = _show(root, commit, path)
        if registered is None:
            raise ValueError(f"pin {target}: commit {commit} has no {path}")
        now = (root / path).read_text()
        if name:
            registered, now = function_source(registered, name), function_source(now, name)
        if registered is None or registered != now:
            raise ValueError(f"pin {target}: the working tree differs from commit {commit}, which registered it; the "
                             f"verdicts are printed only by registered code: git checkout {commit} -- {path}")
    return pins


def first_method_arm_commit(root: Path, state: str, arms: set[str]) -> str | None:
    """The oldest commit that added a confirmation record of an arm not in `arms` (the GRPO arm and the control), or
    a platform control's record."""
    out = subprocess.run(["git", "log", "--reverse", "--diff-filter=A", "--format=%H", "--name-only", "--",
                          f"{state}/runs", f"{state}/platform_control"], cwd=root, capture_output=True,
                         text=True).stdout
    commit = None
    for line in out.splitlines():
        if len(line) == 40 and "/" not in line:
            commit = line
        elif line.endswith(".json") and "/selection/" not in line and \
                (Path(line).name.split("__")[0] not in arms or "/platform_control/" in line):
            return commit
    return None


def check_order(root: Path, pins: dict[str, str], first: str | None) -> dict[str, Any]:
    """Each pinned commit is an ancestor of HEAD and of `first` (the first method-arm record's commit)."""
    for target, commit in pins.items():
        for later, what in ((("HEAD"), "HEAD"), (first, "the first method-arm record's commit")):
            if later is None:
                continue
            if subprocess.run(["git", "merge-base", "--is-ancestor", commit, later], cwd=root).returncode != 0:
                raise ValueError(f"pin {target}: commit {commit} does not precede {what} ({later[:7]}); what prints "
                                 "the verdicts must be registered before the results exist")
    return {"pins": pins, "first_method_arm_commit": first}

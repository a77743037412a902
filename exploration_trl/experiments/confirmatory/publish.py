"""`exploration-trl confirm --combine DIR ... --protocol-commit HASH ...`: publish the verdicts. From each set-up's
output folder (its `result.json` and records) it writes docs/confirmatory.json, whose top level is the first
protocol's set-ups (`combine_v1.py`) and whose `second_protocol` key holds the second's (`combine_v2.py`, after
`integrity_v2.py`'s checks, the pins, the amendments and the platform rule); it fills the verdict blocks of the docs
and copies each set-up's plot beside the json. Combining one protocol's set-ups keeps the other's part of the file.

From the committed records of both protocols it reproduces the published file byte for byte
(`tests/test_confirmatory_publish.py`):

    exploration-trl confirm --combine confirmatory_state/countdown3 confirmatory_state/countdown4 \
        confirmatory_state/countdown3_v2 --protocol-commit 9357c88 4e6b608
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import _common

#: `second_protocol`: the key of docs/confirmatory.json under which the second protocol's set-ups go.
SECOND = "second_protocol"


def resolve_commit(commit: str) -> str:
    """The full hash of `commit`, which must be an ancestor of HEAD (the pre-registration precedes the verdict)."""
    import subprocess

    full = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], capture_output=True, text=True)
    if full.returncode != 0:
        raise ValueError(f"--protocol-commit {commit}: not a commit of this repository")
    sha = full.stdout.strip()
    if subprocess.run(["git", "merge-base", "--is-ancestor", sha, "HEAD"]).returncode != 0:
        raise ValueError(f"--protocol-commit {commit}: not an ancestor of HEAD; the protocol must precede the verdict")
    return sha


def _version(result: dict[str, Any]) -> int:
    return int(result.get("protocol_version", 1))


def combine(args) -> int:
    """The combine step (`confirm --combine`): see the module docstring."""
    from . import combine_v1, runner

    commits = [resolve_commit(c) for c in args.protocol_commit or []]
    results = []
    for d in args.combine:
        path = Path(d) / runner.RESULT_FILE
        if not path.exists():
            raise ValueError(f"--combine {d}: no {runner.RESULT_FILE}; run `exploration-trl confirm --config ... "
                             f"--output-dir {d}` until every run has finished")
        results.append((Path(d), json.loads(path.read_text())))
    versions = sorted({_version(r) for _, r in results})
    if len(commits) != len(versions):
        names = "; ".join(f"protocol {v}: {', '.join(r['name'] for _, r in results if _version(r) == v)}"
                          for v in versions)
        raise ValueError(f"--protocol-commit: give one commit per protocol among the set-ups ({names}), in that "
                         f"order; got {len(commits)}")
    sha = dict(zip(versions, commits))
    first = [(d, r) for d, r in results if _version(r) == 1]
    second = [(d, r) for d, r in results if _version(r) == 2]
    write = Path(args.write)
    current = json.loads(write.read_text()) if write.is_file() else {}
    if first:
        part = combine_v1.combine([r for _, r in first], sha[1],
                                  [combine_v1.diversity(r, runner.collect(d)) for d, r in first])
    else:
        part = {k: v for k, v in current.items() if k != SECOND}
    section = _second_section(second, sha[2], part or None) if second else current.get(SECOND)
    _common.write_json(write, {**part, **({SECOND: section} if section is not None else {})})
    print(f"wrote {write}")
    _copy_plots([d for d, _ in results], [r for _, r in results], write)
    for f in args.fill:
        filled = fill(Path(f), part if first else None, section if second else None)
        print(f"filled the verdicts in {f} ({', '.join(filled)})")
    if first:
        print(combine_v1.verdict_markdown(part))
    if second:
        from . import (  # card_verdicts: what model cards print (hub/protocol_verdict.py)
            card_verdicts,
            combine_v2,
        )

        print(combine_v2.summary_markdown(section))
        cards = card_verdicts.package_path(write)
        print(f"wrote {card_verdicts.write(section, cards)} (the verdicts model cards print)" if cards is not None
              else f"model cards' verdicts not written: {write} is not a checkout's docs/confirmatory.json")
    return 0


def fill(path: Path, first: dict[str, Any] | None, second: dict[str, Any] | None) -> list[str]:
    """Fill the blocks `path` has of each protocol combined now (None: not combined); returns which it filled. A file
    with no block of either is a one-line error."""
    from . import combine_v1, combine_v2

    text = path.read_text()
    filled = []
    for combined, module, name in ((first, combine_v1, "first"), (second, combine_v2, "second")):
        if combined is not None and any(start in text for start in module_starts(module)):
            filled += [f"{name} protocol's {b}" for b in module.fill_verdicts(path, combined)]
    if not filled:
        raise ValueError(f"{path}: has no verdict block of the protocols combined; add one of "
                         f"{', '.join(s for m in (combine_v1, combine_v2) for s in module_starts(m))} where they go")
    return filled


def module_starts(module) -> tuple[str, ...]:
    """The start markers of a protocol's verdict blocks."""
    return tuple(getattr(module, name) for name in ("BLOCK_START", "SUMMARY_START", "ADVICE_START")
                 if hasattr(module, name))


def _copy_plots(dirs, results: list[dict], write: Path) -> None:
    """Each set-up's curve plot into `img/` beside the combined JSON (the docs link it from there)."""
    import shutil

    from . import runner

    for d, r in zip(dirs, results):
        plot = Path(d) / runner.PLOT_FILE
        if plot.exists():
            target = write.parent / "img" / f"confirmatory_{r['name']}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(plot, target)
            print(f"wrote {target}")


def registered_config(sha: str, name: str) -> dict:
    """The set-up's protocol YAML as the protocol commit registered it (read from git, not from the work tree)."""
    import subprocess
    import tempfile

    from . import protocol

    path = f"configs/confirmatory/{name}.yaml"
    shown = subprocess.run(["git", "show", f"{sha}:{path}"], capture_output=True, text=True)
    if shown.returncode != 0:
        raise ValueError(f"--combine: the protocol commit {sha[:7]} has no {path}")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / f"{name}.yaml"
        copy.write_text(shown.stdout)
        return protocol.load(copy)


def _second_section(second: list[tuple[Path, dict]], sha: str, first: dict[str, Any] | None) -> dict[str, Any]:
    """The `second_protocol` section: every check first (each fails loudly before anything is written), then
    `combine_v2.combine`."""
    from . import amendment, combine_v2, integrity_v2, pins, platform_rule, power_curve

    checks, amendments, platforms = {}, {}, {}
    # What prints the verdicts must be the registered code, registered before any method-arm record (pins.py).
    pinned = pins.check(Path.cwd())
    for d, r in second:
        cfg = registered_config(sha, r["name"])
        checks[r["name"]] = integrity_v2.check(cfg, Path(d), sha)  # fails loudly before anything is written
        print(f"{d}: integrity checks passed ({checks[r['name']]['runs']} finished runs, one provenance)")
        reference_arms = {s["label"] for s in cfg["settings"] if s.get("role") not in platform_rule.METHOD_ROLES}
        checks[r["name"]]["pins"] = pins.check_order(Path.cwd(), pinned, pins.first_method_arm_commit(
            Path.cwd(), f"confirmatory_state/{r['name']}", reference_arms))
        found = amendment.load(r["name"], Path.cwd())
        if found is not None:
            amendments[r["name"]] = found
        rule = platform_rule.load(r["name"], Path.cwd())
        if rule is not None:  # amendment 2: every record's platform, and each platform control's reading
            platforms[r["name"]] = platform_rule.section(cfg, Path(d), rule, str(platform_rule.FILES[r["name"]]))
            print(f"{d}: platforms checked ({', '.join(platforms[r['name']]['platforms'])})")
    power = {}
    for _, r in second:  # the registered power code's curve (power_curve.py) and its pre-run +3-point figure
        state = Path("confirmatory_state") / r["name"]
        curve = json.loads((state / "power_curve.json").read_text())["curve"] if (state / "power_curve.json").is_file() \
            else []
        pre = json.loads((state / "pre_run_calibration.json").read_text()).get("power") \
            if (state / "pre_run_calibration.json").is_file() else None
        power[r["name"]] = {"curve": power_curve.with_registered(curve, pre)}
    return combine_v2.combine([r for _, r in second], sha, first, checks, amendments, power, platforms)

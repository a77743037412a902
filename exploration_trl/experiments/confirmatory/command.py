"""`exploration-trl confirm --config configs/confirmatory/<setup>.yaml`: the pre-registered confirmatory protocol
(`protocol.py`). Runs what is missing (resuming a killed run from its last checkpoint), then, once every run has
finished, writes the verdict (`result.json`, `table.md`, `plot.png`) to the output folder. Progress goes to stdout
and `<output>/progress.log`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .. import _common


def register(subparsers) -> None:
    p = subparsers.add_parser("confirm", help="The pre-registered confirmatory protocol (a YAML of settings, seeds, "
                              "steps and the evaluation set): runs, resumes and gives the calibrated verdict.",
                              description=__doc__.splitlines()[0])
    p.add_argument("--config", required=False, help="The protocol YAML (configs/confirmatory/*.yaml).")
    _common.add_output_dir(p, "Output folder (default runs/confirmatory/<name>).")
    p.add_argument("--quick", action="store_true", help="A minutes-long smoke version (tiny model, data and budget).")
    p.add_argument("--only", default=None, help="Comma-separated `label:seed` runs to do now (default: all missing).")
    p.add_argument("--analyse-only", action="store_true", help="Run nothing; write the verdict if every run is done.")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="A second-protocol set-up (protocol_version: 2): run its runs N at a time, each in its own "
                        "process, in the protocol's order; resumable (run the same command again).")
    p.add_argument("--job", default=None, metavar="PHASE:LABEL:SEED",
                   help="Run one run of a second-protocol set-up (what --parallel starts), e.g. confirm:grpo:100.")
    p.add_argument("--combine", nargs="+", default=None, metavar="DIR",
                   help="Write docs/confirmatory.json from these set-ups' output folders (with --protocol-commit).")
    p.add_argument("--protocol-commit", default=None)
    p.add_argument("--write", default="docs/confirmatory.json")
    p.add_argument("--fill", nargs="*", default=["README.md", "docs/confirmatory.md"], metavar="FILE",
                   help="With --combine: files whose confirmatory markers get the verdicts (the full tables between "
                        "<!-- confirmatory:start/end -->, the short table between "
                        "<!-- confirmatory-summary:start/end -->; default README.md docs/confirmatory.md); each "
                        "set-up's plot is copied next to --write as img/confirmatory_<name>.png.")
    p.set_defaults(func=main_from_args)


def _log(output: Path):
    def log(msg: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}"
        print(line, flush=True)
        with open(output / "progress.log", "a") as f:
            f.write(line + "\n")
    return log


def _resolve_commit(commit: str) -> str:
    """The full hash of `commit`, which must be an ancestor of HEAD (the pre-registration precedes the verdict)."""
    import subprocess

    full = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], capture_output=True, text=True)
    if full.returncode != 0:
        raise ValueError(f"--protocol-commit {commit}: not a commit of this repository")
    sha = full.stdout.strip()
    if subprocess.run(["git", "merge-base", "--is-ancestor", sha, "HEAD"]).returncode != 0:
        raise ValueError(f"--protocol-commit {commit}: not an ancestor of HEAD; the protocol must precede the verdict")
    return sha


def _combine(args) -> int:
    from . import analysis, runner

    if not args.protocol_commit:
        raise ValueError("--combine needs --protocol-commit HASH (the commit that pre-registered the protocol)")
    sha = _resolve_commit(args.protocol_commit)
    results, diversities = [], []
    for d in args.combine:
        path = Path(d) / runner.RESULT_FILE
        if not path.exists():
            raise ValueError(f"--combine {d}: no {runner.RESULT_FILE}; run `exploration-trl confirm --config ... "
                             f"--output-dir {d}` until every run has finished")
        results.append(json.loads(path.read_text()))
        if results[-1].get("protocol_version") != 2:
            diversities.append(analysis.diversity(results[-1], runner.collect(Path(d))))
    if any(r.get("protocol_version") == 2 for r in results):
        return _combine_second(args, sha, results)
    combined = analysis.combine(results, sha, diversities)
    write = Path(args.write)
    _common.write_json(write, combined)
    print(f"wrote {write}")
    _copy_plots(args.combine, results, write)
    for f in args.fill:
        filled = analysis.fill_verdicts(Path(f), combined)
        print(f"filled the verdicts in {f} ({' and '.join(filled)})")
    print(analysis.verdict_markdown(combined))
    return 0


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


def _registered_config(sha: str, name: str) -> dict:
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


def _combine_second(args, sha: str, results: list[dict]) -> int:
    """Second-protocol set-ups: their verdicts go under `second_protocol` in --write, beside the first protocol's."""
    from . import amendment, combine_v2, integrity_v2, pins, platform_rule, power_curve

    write = Path(args.write)
    current = json.loads(write.read_text()) if write.is_file() else {}
    first = {k: v for k, v in current.items() if k != "second_protocol"}
    checks, amendments, platforms = {}, {}, {}
    # What prints the verdicts must be the registered code, registered before any method-arm record (pins.py).
    pinned = pins.check(Path.cwd())
    for d, r in zip(args.combine, results):
        cfg = _registered_config(sha, r["name"])
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
    for r in results:  # the registered power code's curve (power_curve.py) and its pre-run +3-point figure
        state = Path("confirmatory_state") / r["name"]
        curve = json.loads((state / "power_curve.json").read_text())["curve"] if (state / "power_curve.json").is_file() \
            else []
        pre = json.loads((state / "pre_run_calibration.json").read_text()).get("power") \
            if (state / "pre_run_calibration.json").is_file() else None
        power[r["name"]] = {"curve": power_curve.with_registered(curve, pre)}
    section = combine_v2.combine(results, sha, first or None, checks, amendments, power, platforms)
    _common.write_json(write, {**current, "second_protocol": section})
    print(f"wrote {write} (second_protocol)")
    _copy_plots(args.combine, results, write)
    for f in args.fill:
        filled = combine_v2.fill_verdicts(Path(f), section)
        print(f"filled the second protocol's verdicts in {f} ({' and '.join(filled)})")
    print(combine_v2.summary_markdown(section))
    from . import card_verdicts  # what model cards print (exploration_trl/hub/protocol_verdict.py)

    cards = card_verdicts.package_path(write)
    print(f"wrote {card_verdicts.write(section, cards)} (the verdicts model cards print)" if cards is not None else
          f"model cards' verdicts not written: {write} is not a checkout's docs/confirmatory.json")
    return 0


def main_from_args(args) -> int:
    from . import analysis, protocol, runner

    if args.combine:
        return _combine(args)
    if not args.config:
        raise ValueError("confirm needs --config configs/confirmatory/<setup>.yaml (or --combine DIR ...)")
    cfg = protocol.load(args.config)
    if args.quick:
        from . import protocol_v2

        cfg = protocol_v2.quick(cfg, protocol.quick(cfg)) if protocol_v2.is_v2(cfg) else protocol.quick(cfg)
    output = Path(args.output or f"runs/confirmatory/{cfg['name']}")
    output.mkdir(parents=True, exist_ok=True)
    log = _log(output)
    if cfg["task"] == "train":
        from .generic import run_generic

        return run_generic(cfg, output, args, log)
    from . import protocol_v2

    if protocol_v2.is_v2(cfg):
        return _second_protocol(args, cfg, output, log)
    planned = runner.plan(cfg)
    if args.only:
        wanted = {(lb, int(sd)) for lb, sd in (x.split(":") for x in args.only.split(","))}
        unknown = wanted - set(planned)
        if unknown:
            raise ValueError(f"--only: {sorted(unknown)} is not a planned run")
        todo_order = [j for j in planned if j in wanted]
    else:
        todo_order = planned
    _common.set_threads(1)
    _, ws = runner.warm_start(cfg, output, log)
    if not args.analyse_only:
        for label, seed in todo_order:
            done = runner.collect(output).get((label, seed))
            if done and done.get("finished"):
                continue
            log(f"[confirm] {cfg['name']}: {label} seed {seed} ({'resuming' if done else 'starting'})")
            rec = runner.run_one(cfg, str(output), label, seed, log)
            last = rec["rows"][-1]
            log(f"[confirm] {cfg['name']}: {label} seed {seed} done: step {last['step']} pass@1 "
                f"{100 * last['pass@1']:.1f} pass@n {100 * last['pass@n']:.1f} ({rec['seconds']:.0f} s)")
    records = runner.collect(output)
    missing = [j for j in planned if not records.get(j, {}).get("finished")]
    if missing:
        log(f"[confirm] {cfg['name']}: {len(planned) - len(missing)}/{len(planned)} runs finished; no verdict yet "
            f"(missing: {', '.join(f'{a}:{b}' for a, b in missing)})")
        return 0
    _, _, split_info = runner.split(cfg, output)
    held = {"n_problems": split_info["n_problems"], "disjoint_from_training": split_info["disjoint_from_training"],
            "checksum": split_info["checksum"], "warm_start_checksum": ws["checksum"]}
    result = analysis.analyse(cfg, records, ws["num_parameters"], held)
    analysis.write(output, result, records, cfg)
    print(analysis.table(result))
    log(f"[confirm] {cfg['name']}: wrote {output / runner.RESULT_FILE}, {runner.TABLE_FILE}, {runner.PLOT_FILE}")
    return 0


def _second_protocol(args, cfg: dict, output: Path, log) -> int:
    """`protocol_version: 2`: one run (`--job`), the verdict (`--analyse-only`) or every run (`--parallel N`)."""
    from . import analysis_v2, driver, runner

    if args.job:
        job = driver.parse_job(args.job, cfg, output)
        _common.set_threads(1)
        rec = runner.run_one(cfg, str(output), job["label"], job["seed"], log, job=job)
        last = rec["rows"][-1]
        log(f"[confirm] {cfg['name']}: {args.job} done: step {last['step']} pass@1 {100 * last['pass@1']:.1f} "
            f"pass@n {100 * last['pass@n']:.1f} ({rec['seconds']:.0f} s)")
        return 0
    if args.analyse_only:
        left = [driver.job_key(j) for j in driver.plan(cfg, output) if not driver.finished(output, j)]
        if left:
            log(f"[confirm] {cfg['name']}: {len(left)} runs not finished; no verdict yet")
            return 0
        analysis_v2.write_verdict(cfg, output, log)
        return 0
    if args.parallel < 1:
        raise ValueError(f"--parallel is {args.parallel}; it must be at least 1")
    return driver.run(args.config, cfg, output, args.parallel, log, quick=args.quick)


def main(argv: list[str] | None = None) -> int:
    """`python -m exploration_trl.experiments.confirmatory.command` (the same as `exploration-trl confirm`)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m exploration_trl.experiments.confirmatory.command")
    register(parser.add_subparsers())
    args = parser.parse_args(["confirm", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())

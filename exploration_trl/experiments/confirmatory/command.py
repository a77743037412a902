"""`exploration-trl confirm --config configs/confirmatory/<setup>.yaml`: the pre-registered confirmatory protocol
(`protocol.py`). Runs what is missing (resuming a killed run from its last checkpoint), then, once every run has
finished, writes the verdict (`result.json`, `table.md`, `plot.png`) to the output folder. Progress goes to stdout
and `<output>/progress.log`."""

from __future__ import annotations

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
    p.add_argument("--protocol-commit", nargs="+", default=None, metavar="HASH",
                   help="With --combine: the commit that pre-registered each protocol among the set-ups, the first "
                        "protocol's first (e.g. 9357c88 4e6b608).")
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


def main_from_args(args) -> int:
    from . import protocol

    if args.combine:
        from .publish import combine

        return combine(args)
    if not args.config:
        raise ValueError("confirm needs --config configs/confirmatory/<setup>.yaml (or --combine DIR ...)")
    cfg = protocol.load(args.config)
    if args.quick:
        cfg = protocol.quick(cfg)
    output = Path(args.output or f"runs/confirmatory/{cfg['name']}")
    output.mkdir(parents=True, exist_ok=True)
    log = _log(output)
    if cfg["task"] == "train":
        from .generic import run_generic

        return run_generic(cfg, output, args, log)
    if protocol.is_v2(cfg):
        return _second_protocol(args, cfg, output, log)
    return _first_protocol(args, cfg, output, log)


def _first_protocol(args, cfg: dict, output: Path, log) -> int:
    """Every missing run in order (or `--only` some), in this process; the verdict once all have finished."""
    from . import analysis, runner

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
    runner.warm_start(cfg, output, log)
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
    result = analysis.write_verdict(cfg, output, log)
    print(analysis.table(result))
    return 0


def _second_protocol(args, cfg: dict, output: Path, log) -> int:
    """`protocol_version: 2`: one run (`--job`), the verdict (`--analyse-only`) or every run (`--parallel N`)."""
    from . import analysis, driver, runner

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
        analysis.write_verdict(cfg, output, log)
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

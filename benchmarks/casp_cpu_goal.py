"""CaSP's CPU time against TRL's after issue 66: on idle cores, one run, trials side by side (interleaved), at most
about 8 minutes. Issue 66's goal: CaSP within 1.05x TRL's CPU time per step.

    python benchmarks/casp_cpu_goal.py             # time, then write benchmarks/scaling_casp66.json and the table
                                                   # between the casp66-cpu-time markers of docs/overhead.md
    python benchmarks/casp_cpu_goal.py --render    # only rewrite that table from the saved JSON

What it times (`overhead.py`'s timing mode: each trial a fresh process, 1 torch thread, CPU seconds of the process per
optimizer step, the first step not timed; the rounds interleaved, so drift in the machine hits every method alike):
TRL, `grpo` (TRL's exact work: the control, its ratio is this machine's noise) and CaSP, at TRL's default
`logging_steps: 10`, in the base workload (vocabulary 32,768, 64 tokens, G 8: 4 rounds) and at Qwen2.5's vocabulary
(151,936, where the LM head is nearly the whole step: 3 rounds). Each cell's trials start within its own share of the
time and none after `BUDGET_S - LONGEST_TRIAL_S` seconds, so the run ends within `BUDGET_S` (8 minutes; on this
project's 2-core Xeon a base trial took about 10 s, a 151,936 one about 24 s, so about 5 minutes); rounds a slower
machine cannot fit are left out and the table says so.

Run it on idle cores only (pause other jobs): the load average is recorded beside each table, and the script warns
when it is above 1.5 at the start. The headline ratio is best-of-rounds (the fastest trial over TRL's fastest).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import overhead  # noqa: E402

METHODS = ["trl", "grpo", "casp"]
#: (workload, rounds, optimizer steps per trial, seconds in which its trials may start), in run order. On this
#: project's 2-core Xeon a base trial took about 10 s and a 151,936-vocabulary one about 24 s (3 steps, load 2).
CELLS = [({**overhead.BASE, "logging_steps": overhead.TRL_LOGGING_STEPS}, 4, 3, 150),
         ({**overhead.BASE, "vocab_size": 151936, "logging_steps": overhead.TRL_LOGGING_STEPS}, 3, 3, 250)]
TARGET = 1.05  #: issue 66: CaSP's CPU time within 1.05x TRL's
BUDGET_S = 480
LONGEST_TRIAL_S = 60  #: a 151,936-vocabulary trial took about 24 s; margin for a slower host
OUTPUT = HERE / "scaling_casp66.json"
DOC = HERE.parent / "docs" / "overhead.md"
BEGIN, END = "<!-- casp66-cpu-time:begin -->", "<!-- casp66-cpu-time:end -->"


def measure_all(output: Path, budget_s: float = BUDGET_S) -> dict:
    """Time every cell of `CELLS` into `output` (saved after every cell). No trial of a cell starts after its own
    seconds have passed (so a slow machine still times every cell, with fewer rounds), nor after `budget_s -
    LONGEST_TRIAL_S` in all."""
    started = time.time()
    last_start = started + budget_s - LONGEST_TRIAL_S
    report = {"runs": {}, "loads": [overhead.machine_load()], "cpu": overhead.cpu_model(),
              "date": datetime.date.today().isoformat(), "methods": METHODS, "target": TARGET}
    for cell, rounds, steps, seconds in CELLS:
        deadline = min(time.time() + seconds, last_start)
        name = overhead.workload_name(cell)
        workload = {k: v for k, v in cell.items() if k != "logging_steps"}
        run = overhead.measure(workload, METHODS, rounds, steps, 1, True, 1, name, cell["logging_steps"],
                               deadline=deadline)
        report["runs"][name] = run
        report["machine"] = overhead.machine_load()
        report["seconds"] = round(time.time() - started, 1)
        output.write_text(json.dumps(report, indent=2))
    return report


def verdict(run: dict) -> str:
    """One line: CaSP's and `grpo`'s best-of CPU ratio and CaSP's peak allocated memory against the goal."""
    methods = run.get("methods", {})
    casp = methods.get("casp")
    if casp is None:
        return "CaSP not measured."
    best, alloc = casp["cpu_ratio"]["best"], casp.get("alloc_ratio", {}).get("median")
    text = (f"CaSP {best:.3f}× TRL's CPU time ({'within' if best <= TARGET else 'over'} {TARGET:.2f}×; "
            f"{casp['rounds']} round(s), round by round {casp['cpu_ratio']['min']:.2f}–{casp['cpu_ratio']['max']:.2f})")
    if alloc is not None:
        text += f", peak allocated {alloc:.4f}× TRL's"
    if "grpo" in methods:
        text += f"; `grpo`, which does TRL's exact work, {methods['grpo']['cpu_ratio']['best']:.3f}×"
    return text + "."


def render(report: dict) -> str:
    """The docs' block: when, where, the load, then per cell the verdict and `overhead.cell_markdown`'s table."""
    loads = ", ".join(report.get("loads", []) + [report.get("machine", "")])
    parts = [f"Measured on {report['date']} by `python benchmarks/casp_cpu_goal.py` "
             f"(`benchmarks/scaling_casp66.json`, {report.get('seconds', 0):.0f} s): {report['cpu']}; "
             f"at the start and the end: {loads}.\n"]
    for name in overhead._grid_order(report["runs"]):
        run = report["runs"][name]
        parts.append(f"- {name}: {verdict(run)}\n")
    parts.append("")
    for name in overhead._grid_order(report["runs"]):
        parts.append(overhead.cell_markdown(name, report["runs"][name]))
    return "\n".join(parts)


def write_doc(report: dict, doc: Path = DOC) -> None:
    """Replace what lies between the markers of `doc` with `render(report)`."""
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: no {BEGIN} ... {END} block to write into")
    block = f"{BEGIN}\n{render(report).rstrip()}\n{END}"
    doc.write_text(re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text, flags=re.DOTALL),
                   encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="only rewrite the docs' table from --output")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args(argv)
    if args.render:
        report = json.loads(args.output.read_text())
    else:
        load = os.getloadavg()[0]
        if load > 1.5:
            print(f"warning: load average {load:.2f}: the cores are not idle, the ratios will be noisy",
                  file=sys.stderr, flush=True)
        report = measure_all(args.output)
    write_doc(report, args.doc)
    for name in overhead._grid_order(report["runs"]):
        print(f"{name}: {verdict(report['runs'][name])}")
    print(f"wrote {args.output} and {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Host-device syncs and aten ops per training step on CPU, for TRL and every registered method (issue 35).

The run of `tests/test_sync_budget.py` (toy Qwen2, `steps_per_generation: 3`, `logging_steps: 3`: step 0 generates,
step 1 only trains and does not log, step 2 only trains and logs; exploration metrics on), counted with
`exploration_trl.ops.sync_count`. Writes `benchmarks/sync_counts.json`; `--label before` stores a run of an older
checkout beside the current one (run this script with that checkout first on PYTHONPATH).

    python benchmarks/sync_counts.py                      # ~3 min on 2 cores
    PYTHONPATH=/path/to/old/checkout python benchmarks/sync_counts.py --label before
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

STEP_NAMES = ("generating", "train_only", "train_only_logging")


def measure(methods: list[str]) -> dict:
    from exploration_trl import __version__
    from helpers import toy_checkpoint
    from test_sync_budget import run_counts

    out = {"version": __version__, "steps": list(STEP_NAMES), "methods": {}}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = toy_checkpoint(Path(tmp) / "ckpt")
        for name in methods:
            method, _, option = name.partition("-")
            overrides = {"cov_selection": "global"} if option == "global" else {}
            if option == "nometrics":
                overrides["exploration_metrics"] = False
            steps = run_counts(ckpt, Path(tmp) / name, None if method == "trl" else method, **overrides)
            out["methods"][name] = {kind: {"syncs": s["syncs"], "aten_ops": s["aten_ops"], "by_op": s["by_op"]}
                                    for kind, s in zip(STEP_NAMES, steps, strict=True)}
            print(name, [s["syncs"] for s in steps], [s["aten_ops"] for s in steps], flush=True)
    return out


def summary(run: dict) -> dict:
    """Per method and step kind: syncs over TRL's and aten ops as a multiple of TRL's."""
    trl = run["methods"]["trl"]
    return {m: {kind: {"extra_syncs": s["syncs"] - trl[kind]["syncs"],
                       "aten_ratio": round(s["aten_ops"] / trl[kind]["aten_ops"], 3)} for kind, s in steps.items()}
            for m, steps in run["methods"].items()}


def main():
    from exploration_trl.trainers.composition import METHODS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = ["trl", *METHODS, "grpo-nometrics", "kl_cov-global", "clip_cov-global"]
    parser.add_argument("--methods", default=",".join(default))
    parser.add_argument("--label", default="after", help="key of this run in the JSON (default: after)")
    parser.add_argument("--output", default=str(HERE / "sync_counts.json"))
    args = parser.parse_args()
    methods = args.methods.split(",")
    if "trl" not in methods:
        methods.insert(0, "trl")
    run = measure(methods)
    run["over_trl"] = summary(run)
    path = Path(args.output)
    report = json.loads(path.read_text()) if path.is_file() else {}
    report[args.label] = run
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path} [{args.label}]")


if __name__ == "__main__":
    main()

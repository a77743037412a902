"""`task: train`: the protocol on any model and task through `exploration-trl train`, once per (setting, seed).

The protocol names a training YAML (`train_config`) that sets the model, data, rewards and the held-out evaluation
(`eval_benchmark`, `eval_n`, ...; `trainers/components/heldout_eval.py`). Each run adds `method`, the setting's
overrides, `seed`, `eval_seed` (the protocol's `eval.seed`), an evaluation and a checkpoint every `gcd(steps)` steps,
and `max_steps = max(steps)`; a killed run resumes from its last checkpoint. eval_pass@1 and eval_pass@<eval_n> are read
from the checkpoint's log history, so the verdict is the countdown set-ups' (`analysis.py`)."""

from __future__ import annotations

import json
import math
import subprocess
from functools import reduce
from pathlib import Path
from typing import Any

from .. import _common
from . import analysis, protocol, runner


def _command(train_argv: list[str], cfg: dict, setting: dict, seed: int, run_dir: Path, last: str | None) -> list[str]:
    steps = sorted(int(s) for s in setting["steps"])
    period = reduce(math.gcd, [s for s in steps if s > 0])
    cmd = [*train_argv, "--config", str(cfg["train_config"]),
           "--method", setting["method"], "--seed", str(seed), "--output_dir", str(run_dir),
           "--eval_seed", str(cfg["eval"]["seed"]), "--eval_n", str(cfg["eval"]["n_samples"]),
           "--eval_strategy", "steps", "--eval_steps", str(period), "--eval_on_start", str(0 in steps).lower(),
           "--save_strategy", "steps", "--save_steps", str(period), "--save_total_limit", "1",
           "--max_steps", str(max(steps))]
    for k, v in (setting.get("overrides") or {}).items():
        cmd += [f"--{k}", json.dumps(v) if isinstance(v, (list, dict)) else str(v)]
    if last:
        cmd += ["--resume_from_checkpoint", last]
    return cmd


def run_generic(cfg: dict[str, Any], output: Path, args, log) -> int:
    from transformers.trainer_utils import get_last_checkpoint

    if "train_config" not in cfg or "eval" not in cfg or "seed" not in cfg["eval"] or "n_samples" not in cfg["eval"]:
        raise ValueError("task: train needs `train_config` and `eval: {seed, n_samples}` in the protocol YAML")
    # How to call `train` comes from the command line that runs us (`cli.entry_point` passes it down: experiments/
    # never import the CLI above them).
    train_argv = getattr(args, "train_argv", None)
    if not train_argv:
        raise ValueError("task: train runs through `exploration-trl confirm` (it calls `exploration-trl train` per run)")
    n = int(cfg["eval"]["n_samples"])
    for label, seed in runner.plan(cfg):
        setting = protocol.setting(cfg, label)
        name = f"{label}__seed{seed}"
        record_path, run_dir = output / "runs" / f"{name}.json", output / "ckpt" / name
        if record_path.is_file() and json.loads(record_path.read_text()).get("finished"):
            continue
        last = get_last_checkpoint(str(run_dir)) if run_dir.is_dir() else None
        log(f"[confirm] {cfg['name']}: {label} seed {seed} ({'resuming' if last else 'starting'})")
        if not args.analyse_only:
            subprocess.run(_command(train_argv, cfg, setting, seed, run_dir, last), check=True)
        last = get_last_checkpoint(str(run_dir)) if run_dir.is_dir() else None
        if last is None:
            continue
        state = json.loads((Path(last) / "trainer_state.json").read_text())
        wanted = {int(s) for s in setting["steps"]}
        rows = [r for r in runner.rows_of(state["log_history"], n) if r["step"] in wanted]
        _common.write_json(record_path, {"label": label, "method": setting["method"], "seed": seed,
                                         "finished": state["global_step"] >= max(wanted), "rows": rows})
    records = runner.collect(output)
    missing = [j for j in runner.plan(cfg) if not records.get(j, {}).get("finished")]
    if missing:
        log(f"[confirm] {cfg['name']}: {len(missing)} runs missing; no verdict yet")
        return 0
    result = analysis.analyse(cfg, records, None, {"n_problems": None, "disjoint_from_training": None})
    analysis.write(output, result, records)
    print(analysis.table(result))
    return 0

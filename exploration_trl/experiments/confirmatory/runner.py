"""Resumable confirmatory runs: the split and warm start of a set-up, one RL run per (setting, seed), evaluated at
the protocol's steps, and the verdict once every run has finished.

Layout under the output folder: `split.json` (the problems, computed once), `warm_start/` (the SFT checkpoint and
`warm_start.json` with its checksum), `runs/<label>__seed<s>.json` (a run's record, rewritten after every
evaluation), `ckpt/<label>__seed<s>/checkpoint-<step>` (the trainer checkpoint saved at each evaluation step, the
last one kept) and, when all runs are done, `result.json`, `table.md` and `plot.png`. A run restarted after a kill
resumes from its last checkpoint (`trainers/resume.py`: the same numbers as an uninterrupted run).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from .. import _common
from . import heldout as heldout_split
from . import protocol

RESULT_FILE, TABLE_FILE, PLOT_FILE = "result.json", "table.md", "plot.png"


def settings_for(cfg: dict[str, Any], seed: int, steps: int):
    """countdown-tiny `Settings` of the protocol's data, model, SFT, RL and evaluation, with RL seed `seed`."""
    from ..countdown_tiny import task

    sft = dict(cfg.get("sft", {}))
    s = task.Settings(seed=int(sft.pop("seed", 0)), data=task.DataSettings(**cfg.get("data", {})),
                      model=task.ModelSettings(**cfg.get("model", {})), sft=task.SFTSettings(**sft))
    for k, v in cfg.get("rl", {}).items():
        setattr(s.rl, k, v)
    ev = {k: v for k, v in cfg.get("eval", {}).items() if k != "seed"}
    for k, v in ev.items():
        setattr(s.eval, k, v)
    s.rl.seed, s.rl.steps = int(seed), int(steps)
    return s


def split(cfg: dict[str, Any], output: Path) -> tuple[list[dict], list[dict], dict]:
    """The set-up's `(train, heldout, info)`, cached in `<output>/split.json` (a `selection` split, when the protocol
    has one, is in `info["selection"]`)."""
    path = Path(output) / "split.json"
    if path.is_file():
        d = json.loads(path.read_text())
        return d["train"], d["heldout"], d["info"]
    s = settings_for(cfg, 0, 1)
    h = cfg["heldout"]
    train, held, info = heldout_split.make_split(s.data, s.seed, h["salt"], float(h["share"]), int(h["num_problems"]),
                                                 selection=cfg.get("selection"))
    _common.write_json(path, {"train": train, "heldout": held, "info": info})
    return train, held, info


def _checksum(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(folder).iterdir()):
        if f.is_file() and f.suffix != ".json" or f.name == "config.json":
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def warm_start(cfg: dict[str, Any], output: Path, log=print) -> tuple[Path, dict]:
    """`(folder, info)` of the set-up's warm start: countdown-tiny's SFT on the training side of the split, trained
    once into `<output>/warm_start` (its `warm_start.json` holds the recipe, size and checksum)."""
    from ..countdown_tiny.sft import train_sft

    folder = Path(output) / "warm_start"
    info_path = folder / "warm_start.json"
    if info_path.is_file():
        return folder, json.loads(info_path.read_text())
    train, _, split_info = split(cfg, output)
    s = settings_for(cfg, 0, 1)
    _common.set_threads(1)
    log(f"[confirm] {cfg['name']}: SFT warm start on {len(train)} problems -> {folder}")
    sft_info = train_sft(s, train, folder, log=log)
    info = {"recipe": {"sft": cfg.get("sft"), "model": cfg.get("model"), "data": cfg.get("data")},
            "num_parameters": sft_info["num_parameters"], "final_loss": sft_info["final_loss"],
            "seconds": sft_info["seconds"], "checksum": _checksum(folder), "split": split_info}
    _common.write_json(info_path, info)
    return folder, info


def rows_of(history: list[dict], n: int) -> list[dict[str, Any]]:
    return [{"step": int(e["step"]), "pass@1": e["eval_pass@1"], "pass@n": e[f"eval_pass@{n}"],
             "distinct_correct": e.get("eval_distinct_correct"),
             "distinct_correct_canonical": e.get("eval_distinct_correct_canonical"),
             "token_entropy": e.get("eval_token_entropy")}
            for e in history if "eval_pass@1" in e]


class Stopped(RuntimeError):
    """Raised by `run_one(stop_after=...)`: the run stops as a kill would, after a checkpoint (tests of resume)."""


def job_paths(output: Path, job: dict[str, Any]) -> tuple[Path, Path]:
    """`(checkpoint folder, record file)` of a run: `runs/<label>__seed<s>.json` for the confirmation,
    `runs/selection/...` for the second protocol's selection runs."""
    name = f"{job['label']}__seed{job['seed']}"
    sub = ("selection",) if job.get("phase") == "selection" else ()
    return Path(output, "ckpt", *sub, name), Path(output, "runs", *sub, f"{name}.json")


def run_one(cfg: dict[str, Any], output: str, label: str, seed: int, log=print,
            stop_after: int | None = None, job: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train one (setting, seed) from the set-up's warm start, evaluating at the setting's steps; resumes from the
    run's last checkpoint. Returns (and writes after every evaluation) the run's record: each evaluation's pass@1 and
    pass@n, and the correct count of every evaluated problem; the provenance of the code that ran. `job` (the second
    protocol) gives the method, overrides, steps and phase instead of the setting named `label`; a selection job is
    evaluated on the selection split. `stop_after` (tests): stop once the checkpoint of that step is saved."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import get_last_checkpoint

    from ..countdown_tiny import rl as countdown_rl
    from . import provenance

    output = Path(output)
    job = job or {**protocol.setting(cfg, label), "seed": seed, "phase": "confirm"}
    steps = sorted({int(x) for x in job["steps"]})
    folder, ws = warm_start(cfg, output, log)
    train, held, info = split(cfg, output)
    s = settings_for(cfg, seed, max(steps))
    if job.get("phase") == "selection":
        bench = heldout_split.benchmark(heldout_split.selection_problems(info), f"{cfg['name']}_selection")
    else:
        bench = heldout_split.benchmark(held, f"{cfg['name']}_heldout")
    run_dir, record_path = job_paths(output, {**job, "label": label, "seed": seed})
    last = get_last_checkpoint(str(run_dir)) if run_dir.is_dir() else None
    previous = json.loads(record_path.read_text()) if record_path.is_file() else {}
    counts = {int(k): v for k, v in (previous.get("correct_counts") or {}).items()}
    started, restore = time.perf_counter(), _common.quiet_training_logs()
    box: dict[str, Any] = {}
    wanted = {x for x in steps if x > 0}
    origin = provenance.current()

    def record(finished: bool) -> dict[str, Any]:
        trainer = box["trainer"]
        rec = {"label": label, "method": job["method"], "overrides": job.get("overrides") or {}, "seed": seed,
               "steps": steps, "finished": finished, "last_step": trainer.state.global_step,
               "rows": rows_of(trainer.state.log_history, s.eval.n_samples),
               "resumed_from": ([*previous.get("resumed_from", [])] + ([last] if last else [])),
               "seconds": previous.get("seconds_before", 0.0) + time.perf_counter() - started,
               "seconds_before": previous.get("seconds_before", 0.0),
               "diverged": trainer.divergence, "n_samples": s.eval.n_samples, "num_problems": len(bench.records),
               "eval_seed": cfg["eval"]["seed"], "warm_start_checksum": ws["checksum"],
               "phase": job.get("phase", "confirm"), "benchmark": bench.name, "provenance": origin,
               "correct_counts": {str(k): v for k, v in sorted(counts.items())}}
        _common.write_json(record_path, rec)
        return rec

    class SaveAndRecord(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in wanted:
                control.should_save = True  # after the evaluation of this step (transformers evaluates, then saves)
            return control

        def on_evaluate(self, args, state, control, **kwargs):
            per_problem = getattr(box["trainer"], "heldout_correct_counts", None)
            if per_problem is not None:
                counts[int(state.global_step)] = per_problem
            record(finished=False)

        def on_save(self, args, state, control, **kwargs):
            if stop_after is not None and state.global_step >= stop_after:
                raise Stopped(f"stopped after step {state.global_step}")

    if previous:
        previous["seconds_before"] = previous.get("seconds", 0.0)
    try:
        trainer, _ = countdown_rl.build_rl_trainer(job["method"], s, folder, train, run_dir,
                                                   job.get("overrides") or {}, callbacks=[SaveAndRecord()])
        trainer.args.save_total_limit = 1
        trainer.args.eval_seed = int(cfg["eval"]["seed"])
        box["trainer"] = trainer
        countdown_rl.attach_heldout_eval(trainer, bench, s, steps, on_start=0 in steps and last is None)
        trainer.train(resume_from_checkpoint=last)
    finally:
        restore()
    rec = record(finished=True)
    shutil.rmtree(run_dir, ignore_errors=True)  # finished: the record holds everything the verdict needs
    return rec


def plan(cfg: dict[str, Any]) -> list[tuple[str, int]]:
    """Run order: the baseline's and the first setting's seeds interleaved, then the baseline's null seeds, then the
    other settings setting by setting (a run cut short by time has whole settings)."""
    base = protocol.setting(cfg, cfg["baseline"])
    others = [s for s in cfg["settings"] if s is not base]
    out: list[tuple[str, int]] = []
    first = others[0] if others else None
    for i, sd in enumerate(base["seeds"]):
        out.append((base["label"], sd))
        if first and i < len(first["seeds"]):
            out.append((first["label"], first["seeds"][i]))
    if first:
        out += [(first["label"], sd) for sd in first["seeds"][len(base["seeds"]):]]
    out += [(base["label"], sd) for sd in base.get("null_seeds", [])]
    for s in others[1:]:
        out += [(s["label"], sd) for sd in s["seeds"]]
    return out


def collect(output: Path, phase: str = "confirm") -> dict[tuple[str, int], dict]:
    """`{(label, seed): record}` of the runs written so far (`phase="selection"`: the second protocol's selection
    runs)."""
    out = {}
    folder = Path(output) / "runs" / ("selection" if phase == "selection" else "")
    for p in sorted(folder.glob("*__seed*.json")):
        rec = json.loads(p.read_text())
        out[(rec["label"], rec["seed"])] = rec
    return out


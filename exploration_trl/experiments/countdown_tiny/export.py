"""`countdown-tiny --sft-only --export DIR`: the warm start as a self-contained checkpoint, with how it was made."""

from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import _common
from .rl import prepare
from .task import Settings

#: Written next to an exported checkpoint: how it was made and how it does on the held-out problems.
EXPORT_INFO = "countdown_tiny_sft.json"


def warm_start_dir() -> Path:
    """The demo's shipped warm start (`exploration_trl/data/warm_start/countdown_tiny`, a folder `from_pretrained`
    loads)."""
    return Path(__file__).resolve().parents[2] / "data" / "warm_start" / "countdown_tiny"


def check_warm_start(path: str, flag: str = "--curves-warm-start") -> Path:
    """`--curves-warm-start` (and the demo's `--warm-start`): a folder `countdown-tiny --sft-only --export` wrote, or
    a one-line error."""
    folder = Path(path)
    if not (folder / EXPORT_INFO).is_file():
        raise ValueError(f"{flag} '{path}' is not a warm start (no {EXPORT_INFO}); make one with "
                         "`exploration-trl countdown-tiny --sft-only --export DIR`")
    return folder


def read_export_info(folder: Path) -> dict[str, Any]:
    """The `EXPORT_INFO` record of an exported warm start: its command, seed, settings (data split, model size), size
    and held-out pass@k."""
    return json.loads((Path(folder) / EXPORT_INFO).read_text())


def export_sft(settings: Settings, cache_dir: Path, export_dir: Path, output: Path, command: str,
               log=print) -> dict[str, Any]:
    """Train (or reuse) the warm start, copy it to `export_dir` as a self-contained checkpoint (model + tokenizer,
    `from_pretrained`-loadable offline) and write `EXPORT_INFO` there: the command, seeds, settings, size and the
    held-out pass@k, measured on the experiment's held-out problems (evaluation files go to `output`)."""
    export_dir = Path(export_dir)
    if export_dir.exists() and (not export_dir.is_dir() or any(export_dir.iterdir())):
        raise ValueError(f"--export: '{export_dir}' exists and is not an empty folder; choose a new folder")
    ws = prepare(settings, cache_dir, output, log=log)
    tmp = export_dir.with_name(export_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(ws.checkpoint, tmp, ignore=shutil.ignore_patterns("sft_info.json"))
    files = sorted(f.name for f in tmp.iterdir())
    size = sum(f.stat().st_size for f in tmp.iterdir())
    summary = ws.eval["summary"]
    info = {
        "command": command,
        "seed": settings.seed,
        "settings": {"data": asdict(settings.data), "model": asdict(settings.model), "sft": asdict(settings.sft),
                     "eval": asdict(settings.eval)},
        "heldout": {"num_problems": summary.get("num_problems"), "n_samples": summary.get("n"),
                    "temperature": settings.eval.temperature, "top_p": settings.eval.top_p,
                    "max_new_tokens": settings.rl.max_completion_length},
        "pass_at_1": summary["pass_at_k"]["1"],
        "pass_at_k": summary["pass_at_k"],
        "distinct_correct_per_problem": (summary.get("solution_multiplicity") or {}).get("mean"),
        "num_parameters": ws.info["num_parameters"],
        "size_bytes": size,
        "size_mb": size / 2**20,
        "files": files,
        "sft": {k: ws.info[k] for k in ("num_examples", "final_loss", "seconds") if k in ws.info},
        **{k: v for k, v in ws.describe().items() if k == "split"},
        "environment": _common.environment(),
    }
    _common.write_json(tmp / EXPORT_INFO, info)
    if export_dir.exists():
        export_dir.rmdir()
    tmp.rename(export_dir)
    return info


def export_command(args) -> str:
    """The command line that reproduces an export (the flags that change the checkpoint or its evaluation)."""
    parts = ["exploration-trl", "countdown-tiny", "--sft-only", "--export", str(args.export), "--seed", str(args.seed)]
    if args.quick:
        parts.append("--quick")
    for flag in ("sft_steps", "sft_hidden_size", "sft_layers", "n_samples", "num_test"):
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    return shlex.join(parts)

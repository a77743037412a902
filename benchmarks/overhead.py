"""Step time and peak memory of each method relative to TRL's `GRPOTrainer`, on one CPU workload.

Workload (issue 3): toy Qwen2 with a 32k vocabulary, 64-token completions, G=8, CPU. Every trial runs in a
fresh subprocess (so peak memory is its own) and trials are interleaved round-robin across methods, so drift
in machine load hits every method alike. Prints a table and writes a JSON of the ratios to TRL.

    python benchmarks/overhead.py --rounds 3 --steps 6 --output benchmarks/overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

METHODS = ["trl", "grpo", "progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov"]


def run_trial(method: str, ckpt: str, steps: int, completion_length: int, out: str, threads: int = 2,
              metrics: bool = True) -> dict:
    """One training run in this process; returns median step time and the peak RSS growth during training."""
    import psutil
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import exploration_trl as et

    torch.set_num_threads(threads)
    if method == "trl":
        trainer_cls, config_cls = GRPOTrainer, GRPOConfig
    else:
        trainer_cls = et.get_trainer_class(method)
        config_cls = trainer_cls.config_class
    extra = {} if method == "trl" else {"exploration_metrics": metrics}
    args = config_cls(
        **extra,
        output_dir=out, per_device_train_batch_size=8, num_generations=8, max_completion_length=completion_length,
        max_steps=steps, learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        seed=0, disable_tqdm=True,
        # Same workload everywhere: one optimizer step per rollout, full-length completions.
        steps_per_generation=1, generation_kwargs={"min_new_tokens": completion_length},
    )
    dataset = Dataset.from_dict({"prompt": ["abc", "bca", "cab", "acb"] * 8})

    def reward(completions, **kw):
        return [len(set(c)) / 32 for c in completions]

    trainer = trainer_cls(model=ckpt, reward_funcs=reward, args=args, train_dataset=dataset)
    proc = psutil.Process()
    before = proc.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    trainer.train()
    done.set()
    sampler.join()
    step_times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h][1:]  # drop warm-up
    return {"step_time": statistics.median(step_times), "peak_rss_delta_mb": (peak[0] - before) / 2**20}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--completion-length", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=32768)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--threads", type=int, default=2, help="torch threads per trial")
    parser.add_argument("--no-metrics", action="store_true", help="exploration_metrics=False for our trainers")
    parser.add_argument("--output", default="benchmarks/overhead.json")
    parser.add_argument("--trial", nargs=2, metavar=("METHOD", "CKPT"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.trial:  # child process: one measurement, printed as JSON
        with tempfile.TemporaryDirectory() as out:
            print("RESULT " + json.dumps(run_trial(args.trial[0], args.trial[1], args.steps, args.completion_length, out,
                                                     args.threads, not args.no_metrics)))
        return

    from exploration_trl.toy import make_toy_checkpoint

    methods = args.methods.split(",")
    results: dict[str, list[dict]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = str(make_toy_checkpoint(Path(tmp) / "ckpt", alphabet="abc", vocab_size=args.vocab_size))
        for r in range(args.rounds):
            order = methods[r % len(methods):] + methods[: r % len(methods)]  # rotate the start each round
            for m in order:
                cmd = [sys.executable, __file__, "--trial", m, ckpt, "--steps", str(args.steps),
                       "--completion-length", str(args.completion_length), "--threads", str(args.threads)]
                cmd += ["--no-metrics"] if args.no_metrics else []
                proc = subprocess.run(cmd, capture_output=True, text=True)
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    sys.exit(f"trial {m} failed:\n{proc.stderr[-3000:]}")
                results[m].append(json.loads(line[7:]))
                print(f"round {r + 1}/{args.rounds} {m:9s} {results[m][-1]}", flush=True)

    ref = results.get("trl")
    table = {}
    for m in methods:
        t = statistics.median(x["step_time"] for x in results[m])
        mem = statistics.median(x["peak_rss_delta_mb"] for x in results[m])
        row = {"step_time_s": round(t, 4), "peak_rss_delta_mb": round(mem, 1)}
        if ref:
            row["time_ratio"] = round(t / statistics.median(x["step_time"] for x in ref), 3)
            row["memory_ratio"] = round(mem / statistics.median(x["peak_rss_delta_mb"] for x in ref), 3)
        table[m] = row
    print(f"\n{'method':10s} {'step s':>8s} {'x TRL':>7s} {'peak MB':>9s} {'x TRL':>7s}")
    for m, row in table.items():
        print(f"{m:10s} {row['step_time_s']:8.3f} {row.get('time_ratio', 1):7.3f} {row['peak_rss_delta_mb']:9.1f} "
              f"{row.get('memory_ratio', 1):7.3f}")
    meta = {"workload": {"vocab_size": args.vocab_size, "completion_length": args.completion_length,
                         "num_generations": 8, "per_device_train_batch_size": 8, "steps": args.steps,
                         "rounds": args.rounds, "threads": args.threads, "exploration_metrics": not args.no_metrics,
                         "device": "cpu"}, "methods": table, "raw": results}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(meta, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

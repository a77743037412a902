"""Step time and peak memory of each method relative to TRL's `GRPOTrainer`, on CPU workloads.

Default run: toy Qwen2 with a 32k vocabulary, 64-token completions, G = 8, exploration metrics on. Every method
on-policy (one optimizer step per rollout; ProGRPO/DS-GRPO read the rollout log-probs from generation's logits and
ProGRPO adds a prompt-only pass) and ProGRPO/DS-GRPO off-policy (`steps_per_generation: 2`, where TRL runs its own
old-log-prob pass and they reuse it), each against TRL on the same workload. Every trial runs in a fresh subprocess
(its peak memory is its own) and trials are interleaved round-robin, so drift in machine load hits every method
alike. Each step is timed in wall seconds (TRL's `step_time`) and in CPU seconds of the process (1 torch thread),
which other jobs on a shared machine disturb less. The headline ratio is best-of-rounds (the fastest trial of a
method over TRL's fastest: other jobs only ever add time); min / median / max of the round-by-round ratios show the
disturbance. Writes `benchmarks/overhead.json`.

    python benchmarks/overhead.py                       # the table in the README (~10 min on 2 cores)
    python benchmarks/overhead.py --check               # exit 1 if a best CPU ratio misses its target beyond noise
    python benchmarks/overhead.py --no-metrics          # exploration_metrics: false
    python benchmarks/overhead.py --logging-steps 10    # the LM-head metrics on every 10th step only
    python benchmarks/overhead.py --scaling             # vocabulary 32k/152k, length 64/512, G 8/16 (~30 min)
    python benchmarks/overhead.py --summarize benchmarks/scaling.json   # re-summarise a saved run
    python benchmarks/overhead.py --device cuda         # one GPU, Qwen2.5-0.5B at random weights, TRL and every
                                                        # registered method (overhead_device.py)
    python benchmarks/overhead.py --dry-run             # the device mode's code on CPU, tiny (a test runs it)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

METHODS = ["trl", "grpo", "progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov"]
OFF_POLICY_METHODS = ["trl", "progrpo", "dsgrpo"]
#: Targets for the median step-time ratio to TRL (the memory target is 1.03 for every method).
TIME_TARGETS = {"grpo": 1.03, "casp": 1.05, "kl_cov": 1.05, "clip_cov": 1.05, "progrpo": 1.10, "dsgrpo": 1.10}
OFF_POLICY_TIME_TARGET = 1.03
MEMORY_TARGET = 1.03
BASE = {"vocab_size": 32768, "completion_length": 64, "num_generations": 8}
#: The scaling run varies one factor at a time from BASE.
SCALING = [dict(BASE), {**BASE, "vocab_size": 151936}, {**BASE, "completion_length": 512},
           {**BASE, "num_generations": 16}]


def run_trial(method: str, ckpt: str, steps: int, completion_length: int, num_generations: int, out: str,
              threads: int, metrics: bool, steps_per_generation: int, logging_steps: int = 1) -> dict:
    """One training run in this process; returns its mean step wall and CPU time and its peak RSS growth."""
    import psutil
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
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
        output_dir=out, per_device_train_batch_size=num_generations, num_generations=num_generations,
        max_completion_length=completion_length, max_steps=steps, learning_rate=1e-4, logging_steps=logging_steps,
        save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=0, disable_tqdm=True,
        gradient_checkpointing=False,
        # Same workload for every method: the same rollouts per optimizer step, full-length completions.
        steps_per_generation=steps_per_generation, generation_kwargs={"min_new_tokens": completion_length},
    )
    dataset = Dataset.from_dict({"prompt": ["abc", "bca", "cab", "acb"] * 16})

    def reward(completions, **kw):
        from exploration_trl.rewards import record_outcomes

        record_outcomes("reward", [c[-1:] or None for c in completions])  # outcome_explore's final answers
        return [len(set(c)) / 32 for c in completions]

    cpu_times: list[float] = []
    wall_times: list[float] = []

    class CpuTime(TrainerCallback):
        """Wall and CPU seconds of this process per optimizer step (CPU time is far less sensitive to other jobs)."""

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.process_time(), time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            cpu_times.append(time.process_time() - self.started[0])
            wall_times.append(time.perf_counter() - self.started[1])

    trainer = trainer_cls(model=ckpt, reward_funcs=reward, args=args, train_dataset=dataset, callbacks=[CpuTime()])
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
    # Mean over the timed steps (the first, warm-up, is dropped): with `steps_per_generation: 2` steps alternate
    # between generating and reusing a rollout, and a median would pick one kind.
    # TRL logs `step_time` averaged over each logging window; with logging_steps > 1 the first window includes the
    # warm-up step, so the wall time is then taken from the callback's wall clock instead.
    step_times = wall_times[1:]
    return {"step_time": statistics.mean(step_times), "step_cpu": statistics.mean(cpu_times[1:]),
            "peak_rss_delta_mb": (peak[0] - before) / 2**20}


def machine_load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def _spread(values: list[float]) -> dict:
    return {"min": round(min(values), 4), "median": round(statistics.median(values), 4), "max": round(max(values), 4)}


def measure(workload: dict, methods: list[str], rounds: int, steps: int, threads: int, metrics: bool,
            steps_per_generation: int, label: str, logging_steps: int = 1) -> dict:
    """Interleaved trials of `methods` on one workload; returns per-method spreads and ratios to `trl`."""
    from exploration_trl.toy import make_toy_checkpoint

    results: dict[str, list[dict]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = str(make_toy_checkpoint(Path(tmp) / "ckpt", alphabet="abc", vocab_size=workload["vocab_size"]))
        for r in range(rounds):
            order = methods[r % len(methods):] + methods[: r % len(methods)]  # rotate the start each round
            for m in order:
                cmd = [sys.executable, __file__, "--trial", m, ckpt, "--steps", str(steps), "--threads", str(threads),
                       "--completion-length", str(workload["completion_length"]),
                       "--num-generations", str(workload["num_generations"]),
                       "--steps-per-generation", str(steps_per_generation), "--logging-steps", str(logging_steps)]
                cmd += [] if metrics else ["--no-metrics"]
                started = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True)
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    sys.exit(f"trial {m} ({label}) failed:\n{proc.stderr[-3000:]}")
                results[m].append(json.loads(line[7:]))
                print(f"[{label}] round {r + 1}/{rounds} {m:9s} step {results[m][-1]['step_time']:.3f} s, "
                      f"peak +{results[m][-1]['peak_rss_delta_mb']:.0f} MB ({time.perf_counter() - started:.0f} s)",
                      flush=True)
    return summarize({**workload, "metrics": metrics, "steps_per_generation": steps_per_generation,
                      "logging_steps": logging_steps, "rounds": rounds, "timed_steps": steps - 1, "threads": threads},
                     results)


def summarize(workload: dict, results: dict[str, list[dict]]) -> dict:
    """Per-method spreads and ratios to `trl` from the raw trials (also re-run on a saved JSON by `--summarize`).

    The headline ratio is `best`: the fastest trial of the method over the fastest trial of TRL. Other jobs on a
    shared machine only ever add time, so the fastest trial is the least disturbed one; the round-by-round ratios
    (min/median/max) show how much the disturbance moved things."""
    ref_time = [x["step_time"] for x in results["trl"]]
    ref_mem = [x["peak_rss_delta_mb"] for x in results["trl"]]
    ref_cpu = [x["step_cpu"] for x in results["trl"]]
    table = {}
    for m, trials in results.items():
        times = [x["step_time"] for x in trials]
        cpus = [x["step_cpu"] for x in trials]
        mems = [x["peak_rss_delta_mb"] for x in trials]
        table[m] = {
            "step_time_s": _spread(times),
            "peak_rss_delta_mb": _spread(mems),
            # Ratios round by round (trials of a round ran back to back), then their spread.
            "time_ratio": {**_spread([t / r for t, r in zip(times, ref_time, strict=True)]),
                           "best": round(min(times) / min(ref_time), 4)},
            "step_cpu_s": _spread(cpus),
            "cpu_ratio": {**_spread([t / r for t, r in zip(cpus, ref_cpu, strict=True)]),
                          "best": round(min(cpus) / min(ref_cpu), 4)},
            "memory_ratio": _spread([t / r for t, r in zip(mems, ref_mem, strict=True)]),
        }
    # Noise: how much TRL's own step time moved between rounds, relative to its median.
    noise = (max(ref_time) - min(ref_time)) / statistics.median(ref_time)
    cpu_noise = (max(ref_cpu) - min(ref_cpu)) / statistics.median(ref_cpu)
    return {"workload": workload, "time_noise": round(noise, 4), "cpu_noise": round(cpu_noise, 4), "methods": table,
            "raw": results}


def print_table(run: dict, title: str):
    print(f"\n{title} (TRL's own spread between rounds: wall ±{run['time_noise'] * 100:.0f}%, "
          f"CPU ±{run['cpu_noise'] * 100:.0f}%)")
    print(f"{'method':10s} {'CPU s':>7s} {'CPU x TRL best':>15s} {'(rounds min/med/max)':>21s} {'wall x TRL best':>16s} "
          f"{'(rounds min/med/max)':>21s} {'peak MB':>8s} {'mem x TRL':>10s}")
    for m, row in run["methods"].items():
        tr, cr = row["time_ratio"], row["cpu_ratio"]
        print(f"{m:10s} {row['step_cpu_s']['min']:7.3f} {cr['best']:15.2f} {cr['min']:7.2f} {cr['median']:6.2f} "
              f"{cr['max']:6.2f} {tr['best']:16.2f} {tr['min']:7.2f} {tr['median']:6.2f} {tr['max']:6.2f} "
              f"{row['peak_rss_delta_mb']['median']:8.1f} {row['memory_ratio']['median']:10.3f}")


def check(runs: dict) -> list[str]:
    """Best-of-rounds CPU-time ratios above their target by more than TRL's own CPU-time spread."""
    misses = []
    for name, run in runs.items():
        noise = run["cpu_noise"]
        for m, row in run["methods"].items():
            if m == "trl":
                continue
            target = OFF_POLICY_TIME_TARGET if name == "off_policy" else TIME_TARGETS.get(m)
            ratio = row["cpu_ratio"]["best"]
            if target is not None and ratio > target + noise:
                misses.append(f"{name}/{m}: step CPU time {ratio:.3f}x TRL > target {target} + noise {noise:.3f}")
            mem = row["memory_ratio"]["median"]
            if mem > MEMORY_TARGET + 0.01:
                misses.append(f"{name}/{m}: peak memory {mem:.3f}x TRL > target {MEMORY_TARGET}")
    return misses


def plot_scaling(runs: list[dict], path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    factors = [("vocab_size", "vocabulary"), ("completion_length", "completion tokens"), ("num_generations", "G")]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for ax, (key, label) in zip(axes, factors, strict=True):
        points = [r for r in runs if all(r["workload"][k] == BASE[k] for k in BASE if k != key)]
        points.sort(key=lambda r: r["workload"][key])
        xs = [r["workload"][key] for r in points]
        for m in points[0]["methods"]:
            if m == "trl":
                continue
            ax.plot(xs, [r["methods"][m]["cpu_ratio"]["best"] for r in points], marker="o", label=m)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel(label)
    axes[0].set_ylabel("step CPU time × TRL (best of rounds)")
    axes[-1].legend(fontsize=8, loc="upper right")
    fig.suptitle("Overhead against TRL GRPOTrainer as the workload grows (CPU, toy Qwen2)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; --scaling 2)")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps per trial, the first not timed (default 5; --scaling 3; --device cuda: 4)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads per trial")
    parser.add_argument("--no-metrics", action="store_true", help="exploration_metrics: false for our trainers")
    parser.add_argument("--logging-steps", type=int, default=1,
                        help="logging_steps of every trial (default 1: the LM-head metrics run on every step)")
    parser.add_argument("--scaling", action="store_true", help="vary vocabulary, length and G (writes a plot)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a median ratio misses its target")
    parser.add_argument("--output", default=None, help="default: benchmarks/overhead.json (scaling.json)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the GPU mode (benchmarks/overhead_device.py; writes benchmarks/overhead_gpu.json)")
    parser.add_argument("--dry-run", action="store_true",
                        help="the device mode on CPU with a tiny model and workload (checks the code, not the numbers)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="device mode: seconds since the epoch after which no method is started (a time cap)")
    parser.add_argument("--summarize", metavar="JSON", default=None,
                        help="recompute the tables (and a scaling plot) from a saved run's raw trials, in place")
    # A single trial, run in a child process.
    parser.add_argument("--trial", nargs=2, metavar=("METHOD", "CKPT"), help=argparse.SUPPRESS)
    parser.add_argument("--completion-length", type=int, default=BASE["completion_length"], help=argparse.SUPPRESS)
    parser.add_argument("--num-generations", type=int, default=BASE["num_generations"], help=argparse.SUPPRESS)
    parser.add_argument("--steps-per-generation", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" or args.dry_run:
        from overhead_device import run

        methods = args.methods.split(",") if args.methods != ",".join(METHODS) else None
        default = None if args.dry_run else Path(__file__).parent / "overhead_gpu.json"
        report = run("cpu" if args.dry_run else "cuda", args.dry_run, methods,
                     Path(args.output) if args.output else default, deadline=args.deadline, steps=args.steps)
        return 1 if report["failed"] else 0
    # --scaling runs 4 workloads, one of them 8x longer: fewer rounds and steps keep it near half an hour on 2 cores.
    args.rounds = args.rounds or (2 if args.scaling else 3)
    args.steps = args.steps or (3 if args.scaling else 5)

    if args.trial:
        with tempfile.TemporaryDirectory() as out:
            result = run_trial(args.trial[0], args.trial[1], args.steps, args.completion_length, args.num_generations,
                               out, args.threads, not args.no_metrics, args.steps_per_generation, args.logging_steps)
        print("RESULT " + json.dumps(result))
        return 0

    here = Path(__file__).parent
    if args.summarize:
        path = Path(args.summarize)
        report = json.loads(path.read_text())
        report["runs"] = {name: summarize(run["workload"], run["raw"]) for name, run in report["runs"].items()}
        for name, run in report["runs"].items():
            print_table(run, name)
        if set(report["runs"]) - {"on_policy", "off_policy"}:  # a --scaling run
            plot_scaling(list(report["runs"].values()), path.with_suffix(".png"))
        path.write_text(json.dumps(report, indent=2))
        print(f"rewrote {path}")
        return 0
    print(machine_load(), flush=True)
    methods = args.methods.split(",")
    if "trl" not in methods:
        methods = ["trl", *methods]
    metrics = not args.no_metrics
    if args.scaling:
        runs = {}
        for workload in SCALING:
            name = "_".join(f"{k}{v}" for k, v in workload.items())
            runs[name] = measure(workload, methods, args.rounds, args.steps, args.threads, metrics, 1, name,
                                 args.logging_steps)
            print_table(runs[name], name)
        output = Path(args.output or here / "scaling.json")
        plot_scaling(list(runs.values()), output.with_suffix(".png"))
        print(f"wrote {output.with_suffix('.png')}")
    else:
        runs = {"on_policy": measure(BASE, methods, args.rounds, args.steps, args.threads, metrics, 1, "on-policy",
                                     args.logging_steps)}
        off = [m for m in OFF_POLICY_METHODS if m in methods]
        if len(off) > 1:
            runs["off_policy"] = measure(BASE, off, args.rounds, args.steps, args.threads, metrics, 2, "off-policy",
                                         args.logging_steps)
        for name, run in runs.items():
            print_table(run, name)
        output = Path(args.output or here / "overhead.json")
    report = {"machine": machine_load(), "runs": runs}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))
    print(f"wrote {output}\n{machine_load()} (at the end)")
    if args.check:
        misses = check(runs)
        for miss in misses:
            print("MISS " + miss)
        return 1 if misses else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

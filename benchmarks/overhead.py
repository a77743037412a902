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
    python benchmarks/overhead.py --scaling             # TRL and every registered method, one factor at a time:
                                                        # length 64/512/2,048, vocabulary 32k/152k, G 8/16, each at
                                                        # logging_steps 10 (TRL's default) and 1 (hours on 2 cores)
    python benchmarks/overhead.py --scaling --list-cells                 # its cells, largest first
    python benchmarks/overhead.py --scaling --workloads V151936 --deadline $(( $(date +%s) + 3600 ))
                                                        # some cells; no trial started after the deadline
    python benchmarks/overhead.py --scaling --resume    # run what benchmarks/scaling.json lacks (it is saved
                                                        # after every trial; progress on stderr)
    python benchmarks/overhead.py --summarize benchmarks/scaling.json   # re-summarise a saved run
    python benchmarks/overhead.py --merge a.json b.json --markdown      # pool runs made side by side into
                                                        # benchmarks/scaling.json; print docs/overhead.md's tables
    python benchmarks/overhead.py --device cuda         # one GPU, Qwen2.5-0.5B at random weights, TRL and every
                                                        # registered method (overhead_device.py)
    python benchmarks/overhead.py --device cuda --large # 2,048 tokens at 151,936 vocabulary, TRL and a few methods
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
#: TRL's own `logging_steps` default (`GRPOConfig`): the exploration metrics' LM-head pass runs on 1 step in 10.
TRL_LOGGING_STEPS = 10
#: The scaling run varies one factor at a time from BASE, the largest workloads first (a run cut short by
#: `--deadline` has measured those): 2,048 tokens, Qwen2.5's 151,936-token vocabulary, G = 16, 512 tokens, BASE.
#: `batch` is the per-device batch (default G): at 2,048 tokens TRL's own (B, T, vocab) logits need it smaller, and
#: the G completions of a rollout then go through G / batch accumulated micro-batches, one optimizer step per
#: rollout, for TRL and every method alike.
SCALING_WORKLOADS = [{**BASE, "completion_length": 2048, "batch": 2}, {**BASE, "vocab_size": 151936},
                     {**BASE, "num_generations": 16}, {**BASE, "completion_length": 512}, dict(BASE)]
#: Each workload at TRL's default logging and at `logging_steps: 1` (the metrics on every step).
SCALING_LOGGING = [TRL_LOGGING_STEPS, 1]
#: Optimizer steps per trial (the first not timed) where a step takes a minute or more on 2 cores.
LONG_WORKLOAD_STEPS = {2048: 2}


def workload_name(workload: dict) -> str:
    """`V151936_T64_G8_log10`; `_b2` where the per-device batch is not G."""
    name = f"V{workload['vocab_size']}_T{workload['completion_length']}_G{workload['num_generations']}"
    if workload.get("batch", workload["num_generations"]) != workload["num_generations"]:
        name += f"_b{workload['batch']}"
    return name + f"_log{workload['logging_steps']}"


def scaling_grid() -> list[dict]:
    """Every (workload, logging) cell of `--scaling`, in the order they are measured."""
    return [{**w, "logging_steps": ls} for w in SCALING_WORKLOADS for ls in SCALING_LOGGING]


def run_trial(method: str, ckpt: str, steps: int, completion_length: int, num_generations: int, out: str,
              threads: int, metrics: bool, steps_per_generation: int, logging_steps: int = 1,
              batch: int | None = None, count_work: bool = False) -> dict:
    """One training run in this process; returns its mean step wall and CPU time and its peak RSS growth.

    `batch` (default `num_generations`) is the per-device batch; a smaller one splits each rollout into
    `num_generations / batch` accumulated micro-batches (still one optimizer step per rollout). `count_work`
    returns instead what the first optimizer step asked of torch (`WorkCounter`): its rollout is the same for
    TRL and every method (same weights, seed and full-length completions), so the counts compare exactly."""
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
    batch = batch or num_generations
    accumulation = num_generations // batch
    args = config_cls(
        **extra,
        output_dir=out, per_device_train_batch_size=batch, num_generations=num_generations,
        gradient_accumulation_steps=accumulation,
        max_completion_length=completion_length, max_steps=steps, learning_rate=1e-4, logging_steps=logging_steps,
        save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=0, disable_tqdm=True,
        gradient_checkpointing=False,
        # Same workload for every method: the same rollouts per optimizer step, full-length completions.
        steps_per_generation=steps_per_generation * accumulation,
        generation_kwargs={"min_new_tokens": completion_length},
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
            if counter is not None and state.global_step == 0:
                counter.__enter__()
            self.started = time.process_time(), time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            cpu_times.append(time.process_time() - self.started[0])
            wall_times.append(time.perf_counter() - self.started[1])
            if counter is not None and state.global_step == 1:
                counter.__exit__(None, None, None)

    counter = WorkCounter() if count_work else None

    trainer = trainer_cls(model=ckpt, reward_funcs=reward, args=args, train_dataset=dataset, callbacks=[CpuTime()])
    proc = psutil.Process()
    allocated = _malloc_in_use()
    before = proc.memory_info().rss
    peak = [before]
    before_alloc = allocated() if allocated else None
    peak_alloc = [before_alloc]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            if allocated:
                peak_alloc[0] = max(peak_alloc[0], allocated())
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
    if counter is not None:
        return counter.counts()
    step_times = wall_times[1:]
    return {"step_time": statistics.mean(step_times), "step_cpu": statistics.mean(cpu_times[1:]),
            "peak_rss_delta_mb": (peak[0] - before) / 2**20,
            "peak_alloc_delta_mb": (peak_alloc[0] - before_alloc) / 2**20 if allocated else None}


class WorkCounter:
    """What a stretch of training asks of torch, counted at the dispatcher (after autograd, so backward included):
    matmul FLOPs (torch's own formulas, `torch.utils.flop_counter`), bytes of the tensors every op writes (views
    and in-place results not counted again: a float64 copy, a `(B, T, V)` temporary or a second pass over the
    vocabulary shows here) and the number of ops. Unlike seconds, these do not move with the machine's load: the
    same step gives the same counts, so a ratio to TRL that grows with T, V or G is seen exactly."""

    def __init__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        self.flops = self.written = self.ops = 0
        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                counter.ops += 1
                formula = flop_registry.get(func._overloadpacket)
                if formula is not None:
                    counter.flops += formula(*args, **kwargs, out_val=out)
                outs = out if isinstance(out, (tuple, list)) else (out,)
                for tensor, returned in zip(outs, func._schema.returns):
                    if isinstance(tensor, torch.Tensor) and returned.alias_info is None:
                        counter.written += tensor.numel() * tensor.element_size()
                return out

        self._mode = Mode()

    def __enter__(self):
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)

    def counts(self) -> dict:
        return {"flops": self.flops, "written_bytes": self.written, "ops": self.ops}


def _malloc_in_use():
    """A function returning the bytes glibc's malloc has handed out and not had back (`mallinfo2`: every arena's
    in-use chunks plus mmapped blocks), or None off glibc. Unlike RSS it does not count freed memory the allocator
    keeps, which makes the resident peak depend on what was freed before (a few tens of MB on this benchmark)."""
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        function = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = Mallinfo2

    def in_use() -> int:
        info = function()
        return info.uordblks + info.hblkhd

    return in_use


def registered_methods() -> list[str]:
    """TRL and every method of the `exploration_trl.methods` registry, in registration order."""
    import exploration_trl.trainers  # noqa: F401  (registers the methods)
    from exploration_trl.methods import METHODS as REGISTERED

    return ["trl", *REGISTERED]


def machine_load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def cpu_model() -> str:
    """The processor's model name (`/proc/cpuinfo`) and how many CPUs this process may use: written beside every
    timed table, since CPU seconds compare only on the same processor."""
    model = "unknown processor"
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} CPUs"


def _spread(values: list[float]) -> dict:
    return {"min": round(min(values), 4), "median": round(statistics.median(values), 4), "max": round(max(values), 4)}


def select_cells(cells: list[dict], spec: str) -> list[dict]:
    """The cells `--workloads` names, in run order: an item that is a cell's full name selects that cell only (so
    `..._log1` does not also select `..._log10`), any other item every cell whose name contains it."""
    names = [workload_name(c) for c in cells]
    chosen = set()
    for item in filter(None, (w.strip() for w in spec.split(","))):
        matches = [n for n in names if n == item] or [n for n in names if item in n]
        if not matches:
            raise SystemExit(f"--workloads: {item!r} names no cell; the cells are {', '.join(names)}")
        chosen.update(matches)
    return [c for c, n in zip(cells, names) if n in chosen]


def trial_command(method: str, ckpt: str, workload: dict, steps: int, threads: int, metrics: bool,
                  steps_per_generation: int, logging_steps: int, count_work: bool = False) -> list[str]:
    """The child process of one trial."""
    cmd = [sys.executable, __file__, "--trial", method, ckpt, "--steps", str(steps), "--threads", str(threads),
           "--completion-length", str(workload["completion_length"]),
           "--num-generations", str(workload["num_generations"]),
           "--batch", str(workload.get("batch", workload["num_generations"])),
           "--steps-per-generation", str(steps_per_generation), "--logging-steps", str(logging_steps)]
    return cmd + ([] if metrics else ["--no-metrics"]) + (["--count-work"] if count_work else [])


def child_result(cmd: list[str]) -> tuple[dict | None, str]:
    """Run one trial's child process: its `RESULT` line as a dict, or None and the end of its stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    return (None, proc.stderr[-3000:]) if line is None else (json.loads(line[7:]), "")


def toy_checkpoint(path: Path, workload: dict) -> str:
    """The toy of `workload`'s vocabulary, with room for its prompt and completion positions."""
    from exploration_trl.toy import make_toy_checkpoint

    positions = max(1024, workload["completion_length"] + 128)  # the toy's default is 1024 (RoPE: same weights)
    return str(make_toy_checkpoint(path, alphabet="abc", vocab_size=workload["vocab_size"],
                                   max_position_embeddings=positions))


def measure(workload: dict, methods: list[str], rounds: int, steps: int, threads: int, metrics: bool,
            steps_per_generation: int, label: str, logging_steps: int = 1, results: dict | None = None,
            on_trial=None, deadline: float | None = None) -> dict:
    """Interleaved trials of `methods` on one workload; returns per-method spreads and ratios to `trl`.

    `results` holds trials already measured (a resumed run): round r of a method that has r trials is skipped.
    `on_trial(results)` is called after every trial (the scaling run saves its JSON there). No trial starts after
    `deadline` (seconds since the epoch); a failed trial is recorded under `failed` and the run goes on."""
    results = results if results is not None else {}
    for m in methods:
        results.setdefault(m, [])
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = None
        for r in range(rounds):
            order = methods[r % len(methods):] + methods[: r % len(methods)]  # rotate the start each round
            for m in order:
                if len(results[m]) > r or m in failed:
                    continue
                if deadline is not None and time.time() > deadline:
                    print(f"[{label}] deadline reached: not started {m} round {r + 1}", file=sys.stderr, flush=True)
                    return _summary(workload, metrics, steps_per_generation, logging_steps, rounds, steps, threads,
                                    results, failed, stopped_at_deadline=True)
                ckpt = ckpt or toy_checkpoint(Path(tmp) / "ckpt", workload)
                cmd = trial_command(m, ckpt, workload, steps, threads, metrics, steps_per_generation, logging_steps)
                started = time.perf_counter()
                result, error = child_result(cmd)
                if result is None:
                    failed[m] = error
                    print(f"[{label}] trial {m} failed:\n{failed[m]}", file=sys.stderr, flush=True)
                    continue
                results[m].append({**result, "load": os.getloadavg()[0]})
                print(f"[{label}] round {r + 1}/{rounds} {m:15s} CPU {results[m][-1]['step_cpu']:.3f} s, "
                      f"wall {results[m][-1]['step_time']:.3f} s, peak +{results[m][-1]['peak_rss_delta_mb']:.0f} MB "
                      f"({time.perf_counter() - started:.0f} s, {machine_load()})", file=sys.stderr, flush=True)
                if on_trial is not None:
                    on_trial(results)
    return _summary(workload, metrics, steps_per_generation, logging_steps, rounds, steps, threads, results, failed)


def _summary(workload, metrics, steps_per_generation, logging_steps, rounds, steps, threads, results, failed,
             stopped_at_deadline=False) -> dict:
    run = summarize({**workload, "metrics": metrics, "steps_per_generation": steps_per_generation,
                     "logging_steps": logging_steps, "rounds": rounds, "timed_steps": steps - 1, "threads": threads},
                    results)
    run["cpu"] = cpu_model()
    if failed:
        run["failed"] = failed
    if stopped_at_deadline:
        run["stopped_at_deadline"] = True
    return run


def summarize(workload: dict, results: dict[str, list[dict]]) -> dict:
    """Per-method spreads and ratios to `trl` from the raw trials (also re-run on a saved JSON by `--summarize`).

    The headline ratio is `best`: the fastest trial of the method over the fastest trial of TRL. Other jobs on a
    shared machine only ever add time, so the fastest trial is the least disturbed one; the round-by-round ratios
    (min/median/max) show how much the disturbance moved things."""
    ref = results.get("trl") or []
    if not ref:  # nothing to compare with yet (a run stopped before TRL's first trial)
        return {"workload": workload, "methods": {}, "raw": results}
    ref_time = [x["step_time"] for x in ref]
    ref_mem = [x["peak_rss_delta_mb"] for x in ref]
    ref_cpu = [x["step_cpu"] for x in ref]
    table = {}
    for m, trials in results.items():
        if not trials:
            continue
        times = [x["step_time"] for x in trials]
        cpus = [x["step_cpu"] for x in trials]
        mems = [x["peak_rss_delta_mb"] for x in trials]
        allocs = [x.get("peak_alloc_delta_mb") for x in trials]
        # Ratios round by round (trials of a round ran back to back; a run cut short pairs the rounds both have),
        # then their spread.
        table[m] = {
            "rounds": len(trials),
            "step_time_s": _spread(times),
            "peak_rss_delta_mb": _spread(mems),
            "time_ratio": {**_spread([t / r for t, r in zip(times, ref_time)]),
                           "best": round(min(times) / min(ref_time), 4)},
            "step_cpu_s": _spread(cpus),
            "cpu_ratio": {**_spread([t / r for t, r in zip(cpus, ref_cpu)]),
                          "best": round(min(cpus) / min(ref_cpu), 4)},
            "memory_ratio": _spread([t / r for t, r in zip(mems, ref_mem)]),
        }
        # Peak bytes in use (malloc), where the trials have it: the memory the run held, not what the allocator kept.
        pairs = [(a, r["peak_alloc_delta_mb"]) for a, r in zip(allocs, ref) if a and r.get("peak_alloc_delta_mb")]
        if pairs:
            table[m]["peak_alloc_delta_mb"] = _spread([a for a in allocs if a])
            table[m]["alloc_ratio"] = _spread([a / r for a, r in pairs])
    # Noise: how much TRL's own step time moved between rounds, relative to its median.
    noise = (max(ref_time) - min(ref_time)) / statistics.median(ref_time)
    cpu_noise = (max(ref_cpu) - min(ref_cpu)) / statistics.median(ref_cpu)
    return {"workload": workload, "time_noise": round(noise, 4), "cpu_noise": round(cpu_noise, 4), "methods": table,
            "raw": results}


def print_table(run: dict, title: str):
    if not run.get("methods"):
        print(f"\n{title}: nothing measured")
        return
    print(f"\n{title} (TRL's own spread between rounds: wall ±{run['time_noise'] * 100:.0f}%, "
          f"CPU ±{run['cpu_noise'] * 100:.0f}%)")
    print(f"{'method':10s} {'CPU s':>7s} {'CPU x TRL best':>15s} {'(rounds min/med/max)':>21s} {'wall x TRL best':>16s} "
          f"{'(rounds min/med/max)':>21s} {'peak MB':>8s} {'mem x TRL':>10s} {'alloc x TRL':>12s}")
    for m, row in run["methods"].items():
        tr, cr = row["time_ratio"], row["cpu_ratio"]
        print(f"{m:10s} {row['step_cpu_s']['min']:7.3f} {cr['best']:15.2f} {cr['min']:7.2f} {cr['median']:6.2f} "
              f"{cr['max']:6.2f} {tr['best']:16.2f} {tr['min']:7.2f} {tr['median']:6.2f} {tr['max']:6.2f} "
              f"{row['peak_rss_delta_mb']['median']:8.1f} {row['memory_ratio']['median']:10.3f} "
              f"{row['alloc_ratio']['median'] if 'alloc_ratio' in row else float('nan'):12.3f}")


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


def _work_runs(work: dict) -> list[dict]:
    """The `work` section as runs of ratios to TRL (`flops_ratio`, `written_ratio`), for the plot."""
    runs = []
    for cell in work.values():
        ref = cell["methods"].get("trl")
        if not ref:
            continue
        runs.append({"workload": cell["workload"], "work": True, "methods": {
            m: {"flops_ratio": {"median": c["flops"] / ref["flops"]},
                "written_ratio": {"median": c["written_bytes"] / ref["written_bytes"]}}
            for m, c in cell["methods"].items()}})
    return runs


def plot_scaling(runs: list[dict], path: Path, work: dict | None = None):
    """One panel per axis (vocabulary, completion tokens, G), rows: CPU ×TRL at TRL's default logging, at
    `logging_steps: 1`, peak allocated memory ×TRL at TRL's default logging and, where `work` (the report's
    `WorkCounter` section) has them, bytes written ×TRL at both. Cells not measured are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    factors = [("vocab_size", "vocabulary"), ("completion_length", "completion tokens"), ("num_generations", "G")]
    rows = [(TRL_LOGGING_STEPS, "cpu_ratio", "best", f"CPU ×TRL, logging_steps {TRL_LOGGING_STEPS}"),
            (1, "cpu_ratio", "best", "CPU ×TRL, logging_steps 1"),
            (TRL_LOGGING_STEPS, "alloc_ratio", "median", f"peak allocated ×TRL, logging_steps {TRL_LOGGING_STEPS}")]
    runs = [r for r in runs if r.get("methods")]
    if work:
        runs += _work_runs(work)
        rows += [(logging, "written_ratio", "median", f"bytes written ×TRL (step 1), logging_steps {logging}")
                 for logging in SCALING_LOGGING]
    methods = list(dict.fromkeys(m for r in runs for m in r["methods"] if m != "trl"))
    colors = {m: plt.cm.tab20(i % 20) for i, m in enumerate(methods)}
    fig, axes = plt.subplots(len(rows), len(factors), figsize=(14, 2 + 2.7 * len(rows)), sharey="row", squeeze=False)
    for j, (key, label) in enumerate(factors):
        for i, (logging, metric, stat, ylabel) in enumerate(rows):
            ax = axes[i][j]
            points = [r for r in runs if r["workload"].get("logging_steps", 1) == logging
                      and r.get("work", False) == (metric == "written_ratio")
                      and all(r["workload"][k] == BASE[k] for k in BASE if k != key)]
            points.sort(key=lambda r: r["workload"][key])
            for m in methods:
                # peak allocated where the trials have it, else peak RSS (runs before it was measured)
                xy = [(r["workload"][key], (r["methods"][m].get(metric) or r["methods"][m]["memory_ratio"])[stat])
                      for r in points if m in r["methods"]]
                if xy:
                    ax.plot(*zip(*xy, strict=True), marker="o", ms=3, lw=1, color=colors[m], label=m)
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            xs = sorted({r["workload"][key] for r in points})
            if xs:
                ax.set_xticks(xs, [str(x) for x in xs])
            if i == len(rows) - 1:
                ax.set_xlabel(label)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes.flat:  # the legend of whichever panel has the most methods
        h, lab = ax.get_legend_handles_labels()
        if len(lab) > len(labels):
            handles, labels = h, lab
    if handles:
        fig.legend(handles, labels, fontsize=8, loc="center right")
    fig.suptitle("Overhead against TRL GRPOTrainer as the workload grows (CPU, toy Qwen2; best of rounds)")
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure_work(cells: list[dict], methods: list[str], metrics: bool, output: Path,
                 deadline: float | None = None) -> dict:
    """`WorkCounter` counts of the first optimizer step, one trial per method and cell, into `output`'s `work`
    section (kept across runs: only what it lacks is measured). Counts do not depend on the machine's load, so
    this can run beside other jobs, or beside a timing run on the other core."""
    report = json.loads(output.read_text()) if output.exists() else {"runs": {}}
    work = report.setdefault("work", {})
    with tempfile.TemporaryDirectory() as tmp:
        for cell in cells:
            name = workload_name(cell)
            workload = {k: v for k, v in cell.items() if k != "logging_steps"}
            counts = work.setdefault(name, {"workload": cell, "methods": {}})["methods"]
            ckpt = None
            for m in methods:
                if m in counts:
                    continue
                if deadline is not None and time.time() > deadline:
                    print(f"[{name}] deadline reached: work of {m} not counted", file=sys.stderr, flush=True)
                    return report
                ckpt = ckpt or toy_checkpoint(Path(tmp) / name, workload)
                cmd = trial_command(m, ckpt, workload, 1, 1, metrics, 1, cell["logging_steps"], count_work=True)
                result, error = child_result(cmd)
                if result is None:
                    print(f"[{name}] work of {m} failed:\n{error}", file=sys.stderr, flush=True)
                    continue
                counts[m] = result
                ref = counts.get("trl")
                ratio = (f" (x TRL: FLOPs {counts[m]['flops'] / ref['flops']:.4f}, written "
                         f"{counts[m]['written_bytes'] / ref['written_bytes']:.4f})" if ref else "")
                print(f"[{name}] work {m:15s} {counts[m]['flops'] / 1e9:.2f} GFLOP, "
                      f"{counts[m]['written_bytes'] / 2**20:.0f} MB written, {counts[m]['ops']} ops{ratio}",
                      file=sys.stderr, flush=True)
                tmp_out = output.with_suffix(".json.tmp")
                tmp_out.write_text(json.dumps(report, indent=2))
                tmp_out.replace(output)
    return report


#: The goal of issue 56 at the largest workloads, TRL's default logging: CPU time within these multiples of TRL's
#: (CaSP's forking-token pass is real extra LM-head work, hence its own), peak allocated memory within 1.02×.
SCALING_CPU_TARGETS = {"casp": 1.10}
SCALING_CPU_TARGET = 1.05
SCALING_MEMORY_TARGET = 1.02


def merge_reports(reports: list[dict]) -> dict:
    """One `--scaling` report from several (cells measured side by side, one core each, into their own files):
    the trials of a cell that appears in more than one are pooled method by method, then every cell is
    re-summarised and `not_measured` dropped (the merged file's `--resume` recomputes it). Pool only runs made at
    the same time: a cell's "best" is each method's fastest trial, so the faster session's trials always win."""
    merged = {"runs": {}, "loads": []}
    for report in reports:
        merged["loads"] += report.get("loads", [])
        for name, run in report["runs"].items():
            cell = merged["runs"].setdefault(name, {"workload": run["workload"], "raw": {}})
            if run.get("cpu"):
                cell.setdefault("cpus", []).append(run["cpu"])
            for method, trials in run["raw"].items():
                cell["raw"].setdefault(method, []).extend(trials)
            if run.get("failed"):
                cell.setdefault("failed", {}).update(run["failed"])
        for name, cell in report.get("work", {}).items():
            into = merged.setdefault("work", {}).setdefault(name, {"workload": cell["workload"], "methods": {}})
            into["methods"].update(cell["methods"])
    for name, cell in merged["runs"].items():
        summary = summarize(cell["workload"], cell["raw"])
        if cell.get("cpus"):
            summary["cpu"] = " / ".join(dict.fromkeys(cell["cpus"]))
        if cell.get("failed"):
            summary["failed"] = cell["failed"]
        merged["runs"][name] = summary
    merged["machine"] = reports[-1].get("machine", "") if reports else ""
    return merged


def _grid_order(names) -> list[str]:
    order = [workload_name(c) for c in scaling_grid()]
    return sorted(names, key=lambda n: order.index(n) if n in order else len(order))


def _describe(workload: dict) -> str:
    text = (f"vocabulary {workload['vocab_size']:,}, {workload['completion_length']:,} tokens, "
            f"G {workload['num_generations']}")
    if workload.get("batch", workload["num_generations"]) != workload["num_generations"]:
        text += f", per-device batch {workload['batch']}"
    return text + f", logging_steps {workload['logging_steps']}"


def cell_markdown(name: str, run: dict) -> str:
    """One cell as a markdown table: per method its trials, best CPU seconds per timed step, the best-of ratio and the
    round-by-round range, and the median peak-allocated and peak-RSS ratios."""
    workload, methods = run["workload"], run.get("methods", {})
    if not methods:
        return f"**{name}** ({_describe(workload)}): nothing measured.\n"
    loads = [t["load"] for trials in run["raw"].values() for t in trials if "load" in t]
    trl = methods["trl"]
    head = (f"**{name}** ({_describe(workload)}; {workload['timed_steps']} timed step(s) per trial; "
            f"1-minute load average {min(loads):.1f}–{max(loads):.1f} on 2 cores during the trials"
            f"{'; ' + run['cpu'] if run.get('cpu') else ''}). "
            f"TRL: {trl['step_cpu_s']['min']:.2f} CPU s per step (its trials ±{run['cpu_noise'] * 100:.1f}%), "
            f"peak allocated +{trl.get('peak_alloc_delta_mb', {}).get('median', float('nan')):.0f} MB.\n\n")
    rows = ["| method | trials | CPU s / step | CPU ×TRL (best) | rounds | peak allocated ×TRL | peak RSS ×TRL |",
            "|---|---|---|---|---|---|---|"]
    for m, row in methods.items():
        if m == "trl":
            continue
        cr = row["cpu_ratio"]
        alloc = row.get("alloc_ratio", {}).get("median")
        rows.append(f"| {m} | {row['rounds']} | {row['step_cpu_s']['min']:.2f} | {cr['best']:.3f} | "
                    f"{cr['min']:.2f}–{cr['max']:.2f} | {'' if alloc is None else f'{alloc:.4f}'} | "
                    f"{row['memory_ratio']['median']:.3f} |")
    missing = [m for m, trials in run["raw"].items() if not trials]
    tail = f"\nNot measured in this cell: {', '.join(missing)}.\n" if missing else ""
    return head + "\n".join(rows) + "\n" + tail


def goal_markdown(report: dict) -> str:
    """Every method against the goal at the largest cells measured at TRL's default logging (one column per
    axis), and what `logging_steps: 1` adds there: `ratio ✓` within the target, `ratio ✗` over it."""
    runs = report["runs"]
    largest = [workload_name({**w, "logging_steps": TRL_LOGGING_STEPS}) for w in SCALING_WORKLOADS[:3]]
    largest = [n for n in largest if runs.get(n, {}).get("methods")]
    methods = list(dict.fromkeys(m for n in largest for m in runs[n]["methods"] if m != "trl"))
    head = "| method | " + " | ".join(f"{n} CPU / alloc ×TRL" for n in largest) + " | logging_steps 1: CPU ×TRL |"
    lines = [head, "|---" * (len(largest) + 2) + "|"]
    for m in methods:
        target = SCALING_CPU_TARGETS.get(m, SCALING_CPU_TARGET)
        cells = []
        for n in largest:
            row = runs[n]["methods"].get(m)
            if row is None:
                cells.append("not measured")
                continue
            cpu, alloc = row["cpu_ratio"]["best"], row.get("alloc_ratio", {}).get("median")
            ok = cpu <= target and (alloc is None or alloc <= SCALING_MEMORY_TARGET)
            cells.append(f"{cpu:.3f} / {'' if alloc is None else f'{alloc:.3f}'} {'✓' if ok else '✗'}")
        log1 = []
        for n in largest:
            row = runs.get(n.replace(f"_log{TRL_LOGGING_STEPS}", "_log1"), {}).get("methods", {}).get(m)
            log1.append(f"{row['cpu_ratio']['best']:.2f}" if row else "–")
        lines.append(f"| {m} ({target:.2f}×) | " + " | ".join(cells) + " | " + " / ".join(log1) + " |")
    return "\n".join(lines) + "\n"


#: The work tables' columns: each axis from the base workload outwards.
WORK_COLUMNS = [dict(BASE), {**BASE, "completion_length": 512}, SCALING_WORKLOADS[0], SCALING_WORKLOADS[1],
                SCALING_WORKLOADS[2]]


def work_markdown(report: dict, logging_steps: int) -> str:
    """Per method, its first step's matmul FLOPs and bytes written ×TRL's (`WorkCounter`) in each workload at
    `logging_steps`: a column per workload, base first, then each axis at its largest."""
    work = report.get("work", {})
    names = [workload_name({**w, "logging_steps": logging_steps}) for w in WORK_COLUMNS]
    names = [n for n in names if work.get(n, {}).get("methods", {}).get("trl")]
    if not names:
        return ""
    methods = list(dict.fromkeys(m for n in names for m in work[n]["methods"] if m != "trl"))
    lines = ["| method | " + " | ".join(n.rsplit("_log", 1)[0] for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for m in methods:
        cells = []
        for n in names:
            counts, ref = work[n]["methods"].get(m), work[n]["methods"]["trl"]
            cells.append("–" if counts is None else f"{counts['flops'] / ref['flops']:.3f} / "
                                                   f"{counts['written_bytes'] / ref['written_bytes']:.3f}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def scaling_markdown(report: dict) -> str:
    """The docs' tables (docs/overhead.md) from a saved `--scaling` report: the goal table, the work tables (matmul
    FLOPs / bytes written ×TRL at logging 10, then 1), then every cell."""
    parts = [goal_markdown(report)]
    for logging in SCALING_LOGGING:
        table = work_markdown(report, logging)
        if table:
            parts.append(f"Work ×TRL (FLOPs / bytes written), logging_steps {logging}:\n\n{table}")
    parts += [cell_markdown(name, report["runs"][name]) for name in _grid_order(report["runs"])]
    return "\n".join(parts)


def run_scaling(methods: list[str], rounds: int, steps: int | None, threads: int, metrics: bool, output: Path,
                cells: list[dict], deadline: float | None = None, resume: bool = False) -> dict:
    """Measure every cell of `cells` (workload + logging_steps), saving `output` after every trial.

    With `resume`, the trials already in `output` are kept and only the missing ones run (the same command
    finishes an interrupted run). Progress lines go to stderr."""
    report = json.loads(output.read_text()) if resume and output.exists() else {"runs": {}}
    report.setdefault("loads", []).append(machine_load())
    output.parent.mkdir(parents=True, exist_ok=True)

    def save():
        report["machine"] = machine_load()
        tmp = output.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report, indent=2))
        tmp.replace(output)

    for cell in cells:
        name = workload_name(cell)
        workload = {k: v for k, v in cell.items() if k != "logging_steps"}
        cell_steps = steps or LONG_WORKLOAD_STEPS.get(workload["completion_length"], 3)
        raw = report["runs"].get(name, {}).get("raw", {})

        def on_trial(results, name=name, workload=workload, cell=cell, cell_steps=cell_steps):
            report["runs"][name] = _summary(workload, metrics, 1, cell["logging_steps"], rounds, cell_steps, threads,
                                            results, {})
            save()

        run = measure(workload, methods, rounds, cell_steps, threads, metrics, 1, name, cell["logging_steps"],
                      results=raw, on_trial=on_trial, deadline=deadline)
        report["runs"][name] = run
        save()
        if run.get("methods"):
            print_table(run, name)
        if run.get("stopped_at_deadline"):
            break
    report["not_measured"] = [workload_name(c) for c in cells
                              if any(len(report["runs"].get(workload_name(c), {}).get("raw", {}).get(m, [])) < rounds
                                     for m in methods)]
    save()
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; --scaling 2)")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps per trial, the first not timed (default 5; --scaling 3; --device cuda: 4)")
    parser.add_argument("--methods", default=None,
                        help="comma list (default: the original seven; --scaling: TRL and every registered method)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per trial")
    parser.add_argument("--no-metrics", action="store_true", help="exploration_metrics: false for our trainers")
    parser.add_argument("--logging-steps", type=int, default=1,
                        help="logging_steps of every trial (default 1: the LM-head metrics run on every step)")
    parser.add_argument("--scaling", action="store_true",
                        help="vary length 64-2,048, vocabulary 32k/152k and G 8/16, at TRL's default logging and at 1 "
                             "(saves the JSON after every trial; writes a plot)")
    parser.add_argument("--workloads", default=None,
                        help="--scaling: comma list of cell names (e.g. V151936_T64_G8_log1: that cell only) or parts of names "
                             "(T2048: every cell containing it); default all")
    parser.add_argument("--resume", action="store_true",
                        help="--scaling: keep the trials already in the output JSON and run only the missing ones")
    parser.add_argument("--list-cells", action="store_true", help="--scaling: print the cells in run order and exit")
    parser.add_argument("--check", action="store_true", help="exit 1 when a median ratio misses its target")
    parser.add_argument("--output", default=None, help="default: benchmarks/overhead.json (scaling.json)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the GPU mode (benchmarks/overhead_device.py; writes benchmarks/overhead_gpu.json)")
    parser.add_argument("--dry-run", action="store_true",
                        help="the device mode on CPU with a tiny model and workload (checks the code, not the numbers)")
    parser.add_argument("--large", action="store_true",
                        help="device mode: 2,048 completion tokens at Qwen2.5's vocabulary, a few methods, logging 10 "
                             "(its own GPU call: overhead_device.LARGE)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds since the epoch after which no trial (device mode: no method) is started")
    parser.add_argument("--summarize", metavar="JSON", default=None,
                        help="recompute the tables (and a scaling plot) from a saved run's raw trials, in place")
    parser.add_argument("--work", action="store_true",
                        help="--scaling: count each method's FLOPs and bytes written on the first step (WorkCounter; "
                             "exact, independent of load) instead of timing it; kept in the output's `work` section")
    parser.add_argument("--count-work", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--markdown", action="store_true",
                        help="--summarize / --merge of a --scaling run: also print docs/overhead.md's tables")
    parser.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                        help="--scaling runs measured side by side (e.g. two cells at a time, one core each): pool "
                             "their trials into --output (default benchmarks/scaling.json) and plot it. Only runs of "
                             "the same hours: best-of takes each method's fastest trial, so a cell re-timed later, on "
                             "a host of another speed, belongs in a file of its own")
    # A single trial, run in a child process.
    parser.add_argument("--trial", nargs=2, metavar=("METHOD", "CKPT"), help=argparse.SUPPRESS)
    parser.add_argument("--completion-length", type=int, default=BASE["completion_length"], help=argparse.SUPPRESS)
    parser.add_argument("--num-generations", type=int, default=BASE["num_generations"], help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--steps-per-generation", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" or args.dry_run:
        from overhead_device import run

        methods = args.methods.split(",") if args.methods and args.methods != ",".join(METHODS) else None
        default = None if args.dry_run else Path(__file__).parent / "overhead_gpu.json"
        report = run("cpu" if args.dry_run else "cuda", args.dry_run, methods,
                     Path(args.output) if args.output else default, deadline=args.deadline, steps=args.steps,
                     large=args.large)
        return 1 if report["failed"] else 0
    # --scaling: fewer rounds and steps (2,048-token cells: 2 steps, `LONG_WORKLOAD_STEPS`).
    args.rounds = args.rounds or (2 if args.scaling else 3)
    if not args.scaling:
        args.steps = args.steps or 5

    if args.trial:
        with tempfile.TemporaryDirectory() as out:
            result = run_trial(args.trial[0], args.trial[1], args.steps, args.completion_length, args.num_generations,
                               out, args.threads, not args.no_metrics, args.steps_per_generation, args.logging_steps,
                               args.batch, count_work=args.count_work)
        print("RESULT " + json.dumps(result))
        return 0

    here = Path(__file__).parent
    if args.merge:
        output = Path(args.output or here / "scaling.json")
        report = merge_reports([json.loads(Path(p).read_text()) for p in args.merge])
        output.write_text(json.dumps(report, indent=2))
        plot_scaling(list(report["runs"].values()), output.with_suffix(".png"), report.get("work"))
        print(scaling_markdown(report) if args.markdown else f"wrote {output} and {output.with_suffix('.png')}")
        return 0
    if args.summarize:
        path = Path(args.summarize)
        report = json.loads(path.read_text())
        # re-summarised from the raw trials; the processor they ran on is kept
        report["runs"] = {name: {**summarize(run["workload"], run["raw"]),
                                 **({"cpu": run["cpu"]} if run.get("cpu") else {})}
                          for name, run in report["runs"].items()}
        for name, run in report["runs"].items():
            print_table(run, name)
        scaling = bool(set(report["runs"]) - {"on_policy", "off_policy"})
        if scaling:
            plot_scaling(list(report["runs"].values()), path.with_suffix(".png"), report.get("work"))
        path.write_text(json.dumps(report, indent=2))
        print(f"rewrote {path}")
        if scaling and args.markdown:
            print(scaling_markdown(report))
        return 0
    if args.scaling:
        cells = scaling_grid()
        if args.workloads:
            cells = select_cells(cells, args.workloads)
        if args.list_cells:
            print("\n".join(workload_name(c) for c in cells))
            return 0
    print(machine_load(), flush=True)
    methods = args.methods.split(",") if args.methods else (registered_methods() if args.scaling else METHODS)
    if "trl" not in methods:
        methods = ["trl", *methods]
    metrics = not args.no_metrics
    if args.scaling and args.work:
        output = Path(args.output or here / "scaling.json")
        report = measure_work(cells, methods, metrics, output, deadline=args.deadline)
        print(f"wrote {output}")
        return 0
    if args.scaling:
        output = Path(args.output or here / "scaling.json")
        report = run_scaling(methods, args.rounds, args.steps, args.threads, metrics, output, cells,
                             deadline=args.deadline, resume=args.resume)
        plot_scaling(list(report["runs"].values()), output.with_suffix(".png"), report.get("work"))
        print(f"wrote {output} and {output.with_suffix('.png')}\n{machine_load()} (at the end)")
        if report["not_measured"]:
            print("not measured (all rounds): " + ", ".join(report["not_measured"]))
        return 0
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

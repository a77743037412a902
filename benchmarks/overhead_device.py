"""The device mode of `benchmarks/overhead.py` (`--device cuda`, `--dry-run`): every method against TRL on one GPU.

The workload is pinned (issue 35): Qwen2.5-0.5B's architecture at random weights, built offline from the shipped
config (`exploration_trl.random_model`, stand-in tokenizer), bf16, 32 completions per optimizer step in groups of
G = 8, 128 completion tokens (`min_new_tokens` pins the length), `steps_per_generation: 2` (even steps generate, odd
steps only train), prompts of 64 characters cut from the shipped GSM8K questions. Each method runs twice: with the
exploration metrics on at `logging_steps: 10` (no step of the run logs) and on every step (`logging_steps: 1`).

A trial is 4 optimizer steps in this process on a freshly initialised model (the same seed for every method): steps
0 and 1 warm up and have their host-device syncs counted (`torch.cuda.set_sync_debug_mode`); step 2 (generating) and
step 3 (train-only) are timed (CUDA synchronised at each step boundary; a step runs from its `on_step_begin` to the
next, so its log is inside). Four steps, not more, so that one call of a lent GPU's 15 minutes measures every method
(docs/gpu_validation.md gives the estimate); `--steps` asks for more.
Reported per trial: train-only and generating step seconds, peak CUDA memory, syncs per step kind. At
`logging_steps: 10` one step in ten logs, so the train-only time there is amortised as 0.9 x the non-logging step
+ 0.1 x the every-step-logging step. `--dry-run` runs the same code on CPU with `random:toy`, short, for the tests.

The methods are TRL and every registered one (`exploration_trl.methods.METHODS`), TRL first, then the methods no GPU
has measured yet (those after 0.4.0's six) before the six. The trials go in two passes: every method at
`logging_steps: 10` (the train-only step users pay), then every method on every step, so a time cap cuts the less
important pass. With a deadline (`--deadline`, what `scripts/gpu_validate.sh` passes) a trial is not started when the
slowest one so far would not finish before it, and SIGTERM stops the run: either way the report keeps what was
measured and names what was not. A trial that raises is recorded (its error and traceback, under `failed`) and the
others go on; the command then exits 1. The report is rewritten after each trial, so even a killed run leaves what it
measured.
"""

from __future__ import annotations

import gc
import importlib.metadata as md
import json
import math
import platform
import signal
import statistics
import time
from pathlib import Path

WORKLOAD = {"model": "random:qwen2.5-0.5b", "dtype": "bfloat16", "completions_per_step": 32, "num_generations": 8,
            "completion_length": 128, "steps_per_generation": 2, "prompt_chars": 64, "steps": 4}
DRY_RUN = {**WORKLOAD, "model": "random:toy", "dtype": "float32", "completions_per_step": 8, "num_generations": 4,
           "completion_length": 8, "prompt_chars": 16}
DRY_RUN_METHODS = ["trl", "grpo", "casp", "clip_cov"]
#: `--large` (issue 56): the longest completions of the CPU scaling run at Qwen2.5's own 151,936-token vocabulary,
#: one group of G = 8 per optimizer step (the per-token cost of generating 2,048 tokens dominates, not the batch),
#: metrics at `logging_steps: 10` only. A trial generates twice (about 50 s each, an estimate: no GPU has run it), so
#: it is its own call of a lent machine (`scripts/gpu_validate.sh --large-only`), TRL and the methods whose extra
#: work grows with T or the vocabulary first.
LARGE = {**WORKLOAD, "completions_per_step": 8, "completion_length": 2048}
DRY_RUN_LARGE = {**DRY_RUN, "completions_per_step": 4, "completion_length": 16}
LARGE_METHODS = ["trl", "casp", "kl_cov", "grpo", "progrpo", "clip_cov", "dsgrpo"]
LARGE_LOGGING = ("logging10",)
#: The methods 0.4.0 measured on an H200; the others have never run on a GPU, so they are measured first.
MEASURED_ON_GPU = ("grpo", "progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov")
LOGGING = {"logging10": 10, "every_step": 1}
COUNTED_STEPS = (0, 1)  # step 0 generates, step 1 only trains
#: Issue 35's GPU goals for the train-only step time over TRL's: metrics at logging_steps 10 (CaSP its own), and on
#: every step.
GOAL_LOGGING10, GOAL_CASP_LOGGING10, GOAL_EVERY_STEP = 1.05, 1.15, 1.10


def registered_methods() -> list[str]:
    """TRL, then every registered method (importing the trainers registers the built-in ones), the ones no GPU has
    measured first."""
    import exploration_trl.trainers  # noqa: F401
    from exploration_trl.methods import METHODS

    return ["trl", *sorted(METHODS, key=lambda m: m in MEASURED_ON_GPU)]


class Stopped(Exception):
    """SIGTERM arrived (the caller's time cap): stop, keep what was measured."""


def _on_sigterm(signum, frame):
    raise Stopped("SIGTERM")


def versions(device: str) -> dict:
    import torch

    out = {}
    for name in ("torch", "transformers", "trl", "accelerate", "peft", "exploration_trl"):
        try:
            out[name] = md.version(name.replace("_", "-"))
        except md.PackageNotFoundError:
            out[name] = "-"
    out["python"] = platform.python_version()
    if device == "cuda":
        out["cuda"] = torch.version.cuda
        out["device"] = torch.cuda.get_device_name(0)
    else:
        out["device"] = f"cpu ({platform.processor() or platform.machine()})"
    return out


def _prompts(chars: int, n: int = 64) -> list[str]:
    from exploration_trl.eval.benchmarks import load_benchmark

    questions = [r["prompt"][0]["content"] for r in load_benchmark("gsm8k", limit=n).records]
    return [q[:chars] for q in questions]  # plain text: one stand-in token per character


def _step_callback(device: str):
    """Per step (from one `on_step_begin` to the next): wall seconds, and the syncs of the counted steps."""
    import torch
    from transformers import TrainerCallback

    from exploration_trl.ops.sync_count import CpuSyncCounter, CudaSyncCounter

    class Steps(TrainerCallback):
        def __init__(self):
            self.seconds: list[float] = []
            self.syncs: dict[int, int] = {}
            self._started = None
            self._counter = None
            self._index = -1

        def _close(self):
            if device == "cuda":
                torch.cuda.synchronize()
            if self._started is not None:
                self.seconds.append(time.perf_counter() - self._started)
            if self._counter is not None:
                self.syncs[self._index] = self._counter.stop()["syncs"]
                self._counter = None

        def on_step_begin(self, args, state, control, **kwargs):
            self._close()
            self._index += 1
            if self._index in COUNTED_STEPS:
                self._counter = CudaSyncCounter() if device == "cuda" else CpuSyncCounter()
                self._counter.start()
            self._started = time.perf_counter()

        def on_train_end(self, args, state, control, **kwargs):
            self._close()

    return Steps()


def trial(method: str, workload: dict, logging_steps: int, device: str, workdir: Path, tokenizer=None) -> dict:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import exploration_trl as et
    from exploration_trl.random_model import DTYPES, build_random_model

    name = workload["model"].removeprefix("random:")
    model, tokenizer = build_random_model(name, dtype=DTYPES[workload["dtype"]], seed=0, device=device,
                                          tokenizer=tokenizer)
    if method == "trl":
        trainer_cls, config_cls, extra = GRPOTrainer, GRPOConfig, {}
    else:
        trainer_cls = et.get_trainer_class(method)
        config_cls, extra = trainer_cls.config_class, {"exploration_metrics": True}
    length = workload["completion_length"]
    args = config_cls(
        **extra, output_dir=str(workdir / f"{method}-{logging_steps}"), seed=0, report_to=[], save_strategy="no",
        per_device_train_batch_size=workload["completions_per_step"], num_generations=workload["num_generations"],
        max_completion_length=length, steps_per_generation=workload["steps_per_generation"],
        max_steps=workload["steps"], logging_steps=logging_steps, learning_rate=1e-6, disable_tqdm=True,
        gradient_checkpointing=False, bf16=device == "cuda" and workload["dtype"] == "bfloat16",
        use_cpu=device == "cpu", generation_kwargs={"min_new_tokens": length},
    )
    dataset = Dataset.from_dict({"prompt": _prompts(workload["prompt_chars"])})

    def reward(completions, **kwargs):
        from exploration_trl.rewards import record_outcomes

        record_outcomes("reward", [c[-1:] or None for c in completions])  # outcome_explore's final answers
        return [len(set(c)) / max(len(c), 1) for c in completions]

    steps = _step_callback(device)
    trainer = trainer_cls(model=model, reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[steps])
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - started
    losses = [e[k] for e in trainer.state.log_history for k in ("loss", "train_loss") if k in e]
    spg = workload["steps_per_generation"]
    timed = range(len(COUNTED_STEPS), len(steps.seconds))
    result = {
        "train_only_s": statistics.mean(steps.seconds[i] for i in timed if i % spg),
        "generating_s": statistics.mean(steps.seconds[i] for i in timed if i % spg == 0),
        "syncs_generating": steps.syncs[0], "syncs_train_only": steps.syncs[1],
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
        "trial_s": round(total, 2),
        # Every logged loss finite (None when none was logged): a method that trains to NaN fails here.
        "loss_finite": all(math.isfinite(float(v)) for v in losses) if losses else None,
    }
    del trainer, model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def _rounded(row: dict) -> dict:
    return {k: _rounded(v) if isinstance(v, dict) else round(v, 4) if isinstance(v, float) else v
            for k, v in row.items()}


def summarize(trials: dict) -> dict:
    """Ratios to TRL per logging mode, the amortised train-only time at logging_steps 10, and the goals."""
    out = {}
    for method, modes in trials.items():
        row = {}
        for mode, r in modes.items():
            ref = trials.get("trl", {}).get(mode)
            if ref is None:
                continue
            row[mode] = {"train_only_x_trl": r["train_only_s"] / ref["train_only_s"],
                         "generating_x_trl": r["generating_s"] / ref["generating_s"],
                         "extra_syncs_train_only": r["syncs_train_only"] - ref["syncs_train_only"],
                         "extra_syncs_generating": r["syncs_generating"] - ref["syncs_generating"]}
            if r["peak_memory_gb"] is not None:
                row[mode]["memory_x_trl"] = r["peak_memory_gb"] / ref["peak_memory_gb"]
        if set(modes) == set(LOGGING) == set(trials.get("trl", {})):
            def amortised(m):
                return 0.9 * m["logging10"]["train_only_s"] + 0.1 * m["every_step"]["train_only_s"]

            ratio = amortised(modes) / amortised(trials["trl"])
            goal = GOAL_CASP_LOGGING10 if method == "casp" else GOAL_LOGGING10
            row["train_only_logging10_amortised_x_trl"] = ratio
            row["meets_goals"] = ratio <= goal and row["every_step"]["train_only_x_trl"] <= GOAL_EVERY_STEP
        out[method] = _rounded(row)
    return out


def print_table(report: dict):
    print(f"\n{report['versions']['device']}; " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()
                                                            if k != "device"))
    print(f"workload: {report['workload']}")
    print(f"{'method':9s} {'mode':10s} {'train s':>8s} {'x TRL':>6s} {'gen s':>7s} {'x TRL':>6s} {'peak GB':>8s} "
          f"{'syncs train/gen':>16s}")
    for method, modes in report["trials"].items():
        for mode, r in modes.items():
            s = report["summary"].get(method, {}).get(mode)
            if s is None:
                continue
            mem = f"{r['peak_memory_gb']:8.2f}" if r["peak_memory_gb"] is not None else f"{'-':>8s}"
            print(f"{method:9s} {mode:10s} {r['train_only_s']:8.3f} {s['train_only_x_trl']:6.2f} "
                  f"{r['generating_s']:7.3f} {s['generating_x_trl']:6.2f} {mem} "
                  f"{r['syncs_train_only']:>8d}/{r['syncs_generating']:<7d}")
        amortised = report["summary"][method].get("train_only_logging10_amortised_x_trl")
        if amortised is not None:
            print(f"{'':9s} train-only at logging_steps 10, amortised: {amortised:.3f} x TRL; goals met: "
                  f"{report['summary'][method]['meets_goals']}")


def _write(report: dict, output: Path | None) -> None:
    """The report so far (summary of the methods measured), atomically."""
    report["summary"] = summarize(report["trials"]) if "trl" in report["trials"] else {}
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = output.with_name(output.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(output)


def run(device: str, dry_run: bool, methods: list[str] | None, output: Path | None,
        deadline: float | None = None, steps: int | None = None, large: bool = False) -> dict:
    """Measure `methods` (default: TRL and every registered method; `--dry-run`: a few) and write the report.

    `deadline` (seconds since the epoch): no trial is started that the slowest so far would carry past it. `steps`:
    optimizer steps per trial (default the workload's 4; at least 4: two warm-up steps, then one of each kind).
    `large`: the `LARGE` workload (2,048 tokens), `LARGE_METHODS` by default, at `logging_steps: 10` only."""
    import tempfile
    import traceback

    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device; use --dry-run on CPU")
    if large:
        workload = dict(DRY_RUN_LARGE if dry_run else LARGE)
    else:
        workload = dict(DRY_RUN if dry_run else WORKLOAD)
    modes = LARGE_LOGGING if large else tuple(LOGGING)
    if steps is not None:
        if steps < 4:
            raise SystemExit(f"error: --steps {steps}: a trial needs at least 4 (2 warm-up steps, then a generating "
                             "and a train-only step)")
        workload["steps"] = steps
    if device == "cpu":
        torch.set_num_threads(1)  # a tiny model: more threads only contend with each other
    methods = methods or (LARGE_METHODS[:3] if large and dry_run else LARGE_METHODS if large
                          else DRY_RUN_METHODS if dry_run else registered_methods())
    if "trl" not in methods:
        methods = ["trl", *methods]
    report = {"versions": versions(device), "workload": workload, "large": large, "methods": methods, "trials": {},
              "failed": {}, "not_run": [], "stopped": None}
    print(f"device: {report['versions']['device']}; versions: " + ", ".join(
        f"{k} {v}" for k, v in report["versions"].items() if k != "device"), flush=True)
    started = time.perf_counter()
    from exploration_trl.random_model import load_config
    from exploration_trl.toy import build_toy_tokenizer

    tokenizer = build_toy_tokenizer(vocab_size=load_config(workload["model"].removeprefix("random:")).vocab_size)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    order = [(mode, method) for mode in modes for method in methods]  # one pass per logging mode
    per_trial: list[float] = []
    done = 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for mode, method in order:
                if deadline is not None and time.time() + max(per_trial, default=0.0) > deadline:
                    report["stopped"] = f"time cap: {len(order) - done} of {len(order)} trials not started"
                    break
                trial_started = time.perf_counter()
                label = f"[{done + 1}/{len(order)}] {method:15s} {mode:10s}"
                try:
                    r = trial(method, workload, LOGGING[mode], device, Path(tmp), tokenizer)
                except Stopped:
                    raise
                except Exception as e:  # noqa: BLE001 - one method's crash must not hide the others' numbers
                    report["failed"].setdefault(method, {})[mode] = {
                        "error": f"{type(e).__name__}: {e}"[:1000], "traceback": traceback.format_exc()[-6000:]}
                    done += 1  # before the line: a SIGTERM sent on reading it finds this trial counted
                    print(f"{label} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    gc.collect()
                    if device == "cuda":
                        torch.cuda.empty_cache()
                else:
                    report["trials"].setdefault(method, {})[mode] = r
                    done += 1
                    print(f"{label} train-only {r['train_only_s']:.3f} s, generating {r['generating_s']:.3f} s, "
                          f"syncs {r['syncs_train_only']}/{r['syncs_generating']}, loss finite {r['loss_finite']} "
                          f"({r['trial_s']:.0f} s)", flush=True)
                per_trial.append(time.perf_counter() - trial_started)
                report["seconds"] = round(time.perf_counter() - started, 1)
                _write(report, output)
    except Stopped as e:
        report["stopped"] = f"{e}: stopped during trial {done + 1} of {len(order)} ({order[done][1]}, {order[done][0]})"
        print(f"stopped ({report['stopped']}); keeping the {done} trials measured", flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    report["not_run"] = [m for m in methods if m not in report["failed"]
                         and set(report["trials"].get(m) or {}) != set(modes)]
    report["seconds"] = round(time.perf_counter() - started, 1)
    _write(report, output)
    if report["trials"].get("trl"):
        print_table(report)
    if report["stopped"]:
        print(f"not run: {', '.join(report['not_run'])} ({report['stopped']})")
    for method, modes in report["failed"].items():
        for mode, failure in modes.items():
            print(f"FAILED: {method} ({mode}): {failure['error']}")
    if output is not None:
        print(f"wrote {output} ({report['seconds']:.0f} s)")
    return report

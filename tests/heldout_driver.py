"""Held-out evaluation under `accelerate launch` (or plain python): `python tests/heldout_driver.py OUT`.

Builds a trainer from the shipped countdown-tiny warm start with 9 held-out problems (an odd number: the processes
hold different counts), runs `trainer.evaluate()` once and writes each process's metrics to OUT/rank<r>.json.
`eval_generation_batch_size == eval_n` makes every `generate` call hold one problem, so the samples depend on the
problem's seed only and a 2-process run must reproduce the 1-process metrics exactly (`tests/test_heldout_eval.py`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from datasets import Dataset

from exploration_trl.experiments import countdown_tiny as ct
from exploration_trl.experiments import demo
from exploration_trl.rewards.countdown import countdown
from exploration_trl.trainers.base import ExplorationGRPOConfig, ExplorationGRPOTrainer


def main(out: Path) -> None:
    s = demo.demo_settings(quick=False)
    train, test = ct.make_problems(s.data, s.seed)
    model, tok = ct.load_checkpoint(demo.warm_start_dir())
    args = ExplorationGRPOConfig(
        output_dir=str(out), max_steps=1, per_device_train_batch_size=4, num_generations=4, max_completion_length=20,
        use_cpu=True, bf16=False, report_to=[], save_strategy="no", disable_tqdm=True, seed=3,
        eval_n=8, eval_ks=[1, 8], eval_generation_batch_size=8,
    )
    data = Dataset.from_dict({"prompt": [ct.prompt_text(p["nums"], p["target"]) for p in train[:8]],
                              "nums": [list(p["nums"]) for p in train[:8]], "target": [p["target"] for p in train[:8]]})
    trainer = ExplorationGRPOTrainer(model=model, processing_class=tok, reward_funcs=countdown, args=args,
                                     train_dataset=data, heldout_benchmark=ct.heldout_benchmark(test, 9))
    metrics = trainer.evaluate()
    rank = trainer.accelerator.process_index
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps({"metrics": metrics, "world": trainer.accelerator.num_processes}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

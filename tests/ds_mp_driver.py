"""Dynamic sampling under a real launch: trains each method a few steps with some prompts' rewards constant.

Run by `tests/test_dynamic_sampling_mp.py` as `accelerate launch --config_file DDP.yaml tests/ds_mp_driver.py OUT ...`
(2 processes) and as plain `python tests/ds_mp_driver.py OUT ...` (the 1-process reference on the same global batch).
Sampling is `mp_driver.ReproducibleSampling` (draws depend on the seed, the generation call and the global row, not
on the process layout), so both runs generate the same rounds; everything else is the real code path.

Writes OUT/<method>/ (the saved model), OUT/<method>/run.json (log history; main process) and the rollouts the
advantage hook saw, per process (OUT/<method>/rollouts/).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from datasets import Dataset

import exploration_trl as et
from helpers import distinct_char_reward
from mp_driver import METHOD_SETTINGS, PROMPTS, ReproducibleSampling

#: Prompts whose reward is constant: their groups never vary and dynamic sampling drops them.
CONSTANT_PROMPTS = {"a", "go", "xyz", "b", "ok", "hi there"}


def partly_constant_reward(completions, prompts, **kwargs):
    return [0.0 if p in CONSTANT_PROMPTS else r
            for p, r in zip(prompts, distinct_char_reward(completions), strict=True)]


def train_one(method: str, ckpt: str, out: Path, per_device: int, max_steps: int, seed: int):
    base = et.get_trainer_class(method)
    trainer_cls = type(f"Reproducible{base.__name__}", (ReproducibleSampling, base), {})
    args = base.config_class(
        output_dir=str(out), per_device_train_batch_size=per_device, num_generations=4, max_completion_length=8,
        max_steps=max_steps, num_iterations=2, steps_per_generation=1, gradient_accumulation_steps=1,
        learning_rate=0.05, optim="sgd", lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
        report_to=[], use_cpu=True, bf16=False, seed=seed, disable_tqdm=True, gradient_checkpointing=False,
        epsilon_high=0.28 if "kl_cov" not in method else float("inf"), debug_rollout_dir=str(out / "rollouts"),
        dynamic_sampling=True, dynamic_sampling_metric="reward", dynamic_sampling_max_rounds=8,
        **METHOD_SETTINGS[method],
    )
    trainer = trainer_cls(model=ckpt, reward_funcs=partly_constant_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    trainer._shapes = []
    trainer.train()
    trainer.save_model(str(out))
    if trainer.accelerator.is_main_process:
        info = {"num_processes": trainer.accelerator.num_processes, "log_history": trainer.state.log_history}
        (out / "run.json").write_text(json.dumps(info))
    trainer.accelerator.wait_for_everyone()
    return trainer


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--methods", default=",".join(METHOD_SETTINGS))
    parser.add_argument("--global-batch", type=int, default=12)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    a = parser.parse_args(argv)
    from accelerate import PartialState

    state = PartialState(cpu=True)
    trainer = None
    for method in a.methods.split(","):
        trainer = train_one(method, a.ckpt, Path(a.out) / method, a.global_batch // state.num_processes,
                            a.max_steps, a.seed)
    if trainer is not None:
        trainer.accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())

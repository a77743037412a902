"""Resume inside a rollout's updates, for every method, in ONE launch (1 process with `python`, 2 with
`accelerate launch`). Run by `tests/test_resume.py`.

For each method: an uninterrupted run that checkpoints at step `resume_at`, then a second trainer resumed from that
checkpoint with `--resume_from_checkpoint`'s code path (`train(resume_from_checkpoint=...)`). `resume_at` always
falls inside a rollout's updates (`_step % (steps_per_generation * num_iterations) != 0`), and every run goes on past
the next generation, so the resumed run both finishes the saved rollout and samples the next one. The layouts
differ per method to cover `steps_per_generation`, `num_iterations` and gradient accumulation: the issue's GRPO with
`steps_per_generation: 4`, KL-Cov/Clip-Cov with their default 8 updates per rollout, and 2 iterations per rollout.

Writes OUT/<method>/result.json on the main process: the max |param difference| between the two final models, the
logged values of both runs after `resume_at`, and whether the checkpoint fell inside a rollout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM

import exploration_trl as et
from helpers import distinct_char_reward
from mp_driver import METHOD_SETTINGS, PROMPTS

#: method -> (steps_per_generation, gradient_accumulation_steps, num_iterations, max_steps, resume_at); None keeps
#: the method's default steps_per_generation (KL-Cov/Clip-Cov: 8 updates per rollout).
LAYOUTS = {
    "grpo": (4, 1, 1, 5, 2),
    "progrpo": (2, 1, 2, 5, 2),
    "dsgrpo": (4, 2, 1, 3, 1),
    "casp": (2, 1, 2, 5, 3),
    "kl_cov": (None, 1, 1, 9, 3),
    "clip_cov": (None, 1, 1, 9, 5),
    "progrpo+casp": (2, 1, 2, 5, 2),
    "pkpo": (4, 1, 1, 5, 3),
    "unlikely": (2, 1, 2, 5, 2),
    "passk": (2, 1, 2, 5, 2),
    "grpo_dynamic_sampling": (2, 1, 1, 6, 3),
    "maxrl": (2, 1, 2, 5, 2),
    "wreinforce": (4, 1, 1, 5, 3),
    "qae": (2, 1, 1, 5, 3),
    "entropy_adv": (2, 1, 2, 5, 3),  # shapes each update afresh: the resumed rollout's advantages must be unshaped
    "outcome_explore": (2, 1, 1, 6, 3),  # the answer counts of the batches before the checkpoint are restored
}
#: A registered method without a row above: two updates per rollout, resumed at step 3, inside its second rollout.
DEFAULT_LAYOUT = (2, 1, 2, 5, 3)


def layout(method: str) -> tuple:
    return LAYOUTS.get(method, DEFAULT_LAYOUT)


def cases() -> list[str]:
    """What a launch resumes: the rows above, then every registered method without one (at `DEFAULT_LAYOUT`), so
    that a new method's module is tested without an edit here."""
    from helpers import cases_with

    return cases_with(LAYOUTS)


#: Cases that are not a method name: the method they train, a reward and config changes. Dynamic sampling needs
#: groups whose reward does not vary (a 0/1 reward) and a learning rate low enough that they keep varying, so that
#: refills happen both before the checkpoint and after it.
CASE_METHOD = {"grpo_dynamic_sampling": "grpo"}


def at_least_five_distinct_chars(completions, **kwargs):
    return [1.0 if r >= 5 / 8 else 0.0 for r in distinct_char_reward(completions)]


def odd_character_sum(completions, **kwargs):
    """A 0/1 reward that is 1 for about half of the toy model's completions."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(sum(map(ord, t)) % 2) for t in texts]


#: passk's advantages are zero unless a group has at least k wrong answers (and one right): with the graded reward
#: nearly every toy completion clears its threshold, so passk gets a 0/1 reward that is right about half the time.
CASE_REWARD = {"grpo_dynamic_sampling": at_least_five_distinct_chars, "passk": odd_character_sum}
CASE_CONFIG = {"grpo_dynamic_sampling": {"learning_rate": 0.01, "per_device_train_batch_size": 8}}
#: mp_driver's settings, except Clip-Cov: half the tokens, drawn at random (its private generator is restored too).
SETTINGS = {**METHOD_SETTINGS, "clip_cov": {"clip_cov_ratio": 0.5, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9},
            "grpo_dynamic_sampling": {"dynamic_sampling": True, "dynamic_sampling_metric": "reward",
                                      "dynamic_sampling_max_rounds": 3}}
COMPARED = ("loss", "grad_norm", "reward", "entropy", "exploration/lambda_sample", "exploration/branching_factor",
            "exploration/entropy_correct", "exploration/entropy_wrong")


def make_trainer(method: str, ckpt: str, out: Path, per_device: int, seed: int, save_steps: int):
    cls = et.get_trainer_class(CASE_METHOD.get(method, method))
    spg, ga, iters, max_steps, _ = layout(method)
    steps = {} if spg is None else {"steps_per_generation": spg}
    config = dict(
        output_dir=str(out), per_device_train_batch_size=per_device, num_generations=4, max_completion_length=6,
        max_steps=max_steps, num_iterations=iters, gradient_accumulation_steps=ga, learning_rate=0.05,
        optim="adamw_torch", lr_scheduler_type="linear", logging_steps=1, save_strategy="steps",
        save_steps=save_steps, report_to=[], use_cpu=True, bf16=False, seed=seed, disable_tqdm=True,
        **steps, **SETTINGS.get(method, {}),
    )
    args = cls.config_class(**{**config, **CASE_CONFIG.get(method, {})})
    dataset = Dataset.from_dict({"prompt": PROMPTS * 4})  # 48 prompts: KL-Cov's 8-slice rollouts on 2 processes
    return cls(model=ckpt, reward_funcs=CASE_REWARD.get(method, distinct_char_reward), args=args,
               train_dataset=dataset)


def logged(trainer, after: int) -> dict:
    return {str(e["step"]): {k: e[k] for k in COMPARED if k in e}
            for e in trainer.state.log_history if "loss" in e and e["step"] > after}


def run_one(method: str, ckpt: str, out: Path, per_device: int, seed: int):
    _, _, _, max_steps, resume_at = layout(method)
    full = make_trainer(method, ckpt, out / "full", per_device, seed, save_steps=resume_at)
    full.train()
    generate_every = full.args.steps_per_generation * full.num_iterations
    step_at_checkpoint = resume_at * full.args.gradient_accumulation_steps
    resumed = make_trainer(method, ckpt, out / "resumed", per_device, seed, save_steps=max_steps)
    resumed.train(resume_from_checkpoint=str(out / "full" / f"checkpoint-{resume_at}"))
    full_params = dict(full.model.named_parameters())
    diff = max((full_params[n] - p).abs().max().item() for n, p in resumed.model.named_parameters())
    base = dict(AutoModelForCausalLM.from_pretrained(ckpt).named_parameters())
    moved = max((base[n] - p.detach().cpu()).abs().max().item() for n, p in full.model.named_parameters())
    if full.accelerator.is_main_process:
        result = {
            "method": method, "num_processes": full.accelerator.num_processes, "max_param_diff": diff,
            "moved": moved, "inside_rollout": step_at_checkpoint % generate_every != 0,
            "generations_after_resume": (max_steps * full.args.gradient_accumulation_steps - 1) // generate_every
            - step_at_checkpoint // generate_every,
            "full_log": logged(full, resume_at), "resumed_log": logged(resumed, resume_at),
            "refill_rounds": {str(e["step"]): e["dynamic_sampling/rounds"] for e in full.state.log_history
                              if "dynamic_sampling/rounds" in e},
        }
        (out / "result.json").write_text(json.dumps(result))
    full.accelerator.wait_for_everyone()
    return full


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--methods", default=None, help="comma-separated cases (default: `cases()`)")
    parser.add_argument("--per-device", type=int, default=4)
    parser.add_argument("--seed", type=int, default=11)
    a = parser.parse_args(argv)
    from accelerate import PartialState

    PartialState(cpu=True)
    trainer = None
    for method in (a.methods.split(",") if a.methods is not None else cases()):
        trainer = run_one(method, a.ckpt, Path(a.out) / method, a.per_device, a.seed)
    if trainer is not None:
        trainer.accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Trains every method a few steps in ONE launch, under whatever engine `accelerate launch` set up.

Run by `tests/test_multiprocess.py` as `accelerate launch [--config_file ENGINE.yaml] tests/mp_driver.py OUT ...`
(and as plain `python tests/mp_driver.py` for the unwrapped single-process reference). One launch trains all methods
one after the other, so the engines' start-up is paid once per engine.

For a 2-process run and a 1-process run on the same global batch to be comparable, both must sample the same
completions. TRL samples with `generate`, whose random draws depend on how rows are split across processes, so
this harness replaces only the sampling step (`_generate_single_turn`): every row draws its tokens from the policy's
own distribution with a generator seeded by (seed, generation call, global row index), one forward per token.
Everything else — TRL's loss, the advantage and loss hooks, the collectives, DDP/DeepSpeed/FSDP — is the real
code path. Each row's completion is also capped by its global index (rows past the first half stop after 3 tokens),
so processes hold completions of different lengths, and prompts of different lengths, as in real runs.

Writes OUT/<method>/ (and OUT/lora-<method>/ for `--lora-methods`: the saved model, as `save_model` writes it under the engine), OUT/<method>/run.json (log
history, wrapper classes; main process), OUT/<method>/shapes_rank<r>.json (per-generation prompt/completion
widths seen by each process) and OUT/<method>/folds_rank<r>.json (how many of CaSP's captures of TRL's LM-head
passes carried the candidates, and how many fell back to CaSP's own projection, on each process).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from datasets import Dataset
from trl.models import unwrap_model_for_generation

import exploration_trl as et
from exploration_trl.rewards import record_failure
from exploration_trl.boundary import fused_head
from helpers import distinct_char_reward

#: CaSP's captured TRL passes on this process, per method: folded (carried the candidates) or fell back.
FOLDS = {"folded": 0, "fell_back": 0}


def count_folds() -> None:
    """Count each capture's outcome in `FOLDS` (the driver's process only: `main` calls it)."""
    result = fused_head.FoldedCandidates.result

    def counted(self):
        got = result(self)
        FOLDS["folded" if got is not None else "fell_back"] += 1
        return got

    fused_head.FoldedCandidates.result = counted

#: Per-method settings. Strong enough that a 3-step toy run visibly differs from GRPO, and chosen so that the
#: method's action does not depend on how rows are split into micro-batches (see the module docstring of
#: tests/test_multiprocess.py): KL-Cov and Clip-Cov select tokens within each process's micro-batch, as verl does,
#: so here they select every token (ratio 1, unbounded covariance window) and the 1- and 2-process runs agree.
METHOD_SETTINGS = {
    "grpo": {},
    "progrpo": {"progrpo_alpha": 20.0},
    "dsgrpo": {"ds_gamma_p": 0.5, "ds_gamma_n": 0.5},
    "casp": {"casp_alpha": 0.5, "casp_entropy_quantile": 0.5, "casp_top1_penalty": 2.0},
    "kl_cov": {"kl_cov_ratio": 1.0, "kl_cov_coef": 1.0},
    "clip_cov": {"clip_cov_ratio": 1.0, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9},
    "progrpo+casp": {"progrpo_alpha": 20.0, "casp_alpha": 0.5, "casp_entropy_quantile": 0.5, "casp_top1_penalty": 2.0},
    # The pass@k methods need groups with both right and wrong completions: correct = at least 3 distinct characters.
    "passk": {"passk_k": 2, "correct_reward_threshold": 0.3},
    "pkpo": {"pkpo_k": 3},
    "unlikely": {"unlikely_beta": 1.0, "correct_reward_threshold": 0.3},
    # MaxRL and W-REINFORCE split correct from wrong like the pass@k methods; QAE and the entropy advantage act on the
    # graded reward; outcome exploration counts the last character of each completion (helpers.distinct_char_reward)
    # across both processes.
    "maxrl": {"correct_reward_threshold": 0.3},
    "wreinforce": {"correct_reward_threshold": 0.3, "wreinforce_lambda": 0.5},
    "qae": {"qae_k": 0.4},
    "entropy_adv": {"entropy_adv_alpha": 0.4},
    "outcome_explore": {"outcome_ucb_coef": 0.5, "outcome_batch_coef": 0.5},
    "maxrl+entropy_adv": {"correct_reward_threshold": 0.3, "entropy_adv_alpha": 0.4},
    # cov_selection: global chooses over every process, so a real selection ratio gives the same tokens in 1 and 2.
    "kl_cov-global": {"kl_cov_ratio": 0.2, "kl_cov_coef": 1.0, "cov_selection": "global"},
    "clip_cov-global": {"clip_cov_ratio": 0.2, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9, "cov_selection": "global"},
}

def cases() -> list[str]:
    """What one launch trains: the cases above, then every registered method that has none (at its defaults), so
    that a new method's module is tested under every engine without an edit here."""
    from helpers import cases_with

    return cases_with(METHOD_SETTINGS)


def counted_reward(completions, **kwargs):
    """`distinct_char_reward`, with each completion shorter than 4 characters also counted as a reward failure (its
    score kept, so training is unchanged): `rewards/counted_reward/failures` must be summed over processes."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    record_failure("counted_reward", sum(len(t) < 4 for t in texts))
    return distinct_char_reward(completions, **kwargs)


PROMPTS = [
    "sum 12 and 7", "a", "write the longest word you know, then stop", "go", "count to three please",
    "xyz", "repeat after me: abc abc abc", "hi there", "b", "what is two plus two?", "ok", "name a color",
]


class ReproducibleSampling:
    """Sampling whose draws depend only on (seed, call, global row), not on the process layout."""

    short_rows_from = 0.5  # rows at or past this fraction of the global batch stop after `SHORT` tokens
    SHORT = 3

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        self._sampling_calls = getattr(self, "_sampling_calls", 0) + 1
        n_local = len(prompt_ids)
        offset = self.accelerator.process_index * n_local
        n_global = n_local * self.accelerator.num_processes
        eos = set(self.eos_token_ids)
        device = self.accelerator.device
        completions = []
        with (
            unwrap_model_for_generation(self.model_wrapped, self.accelerator, gather_deepspeed3_params=True) as model,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            for i, ids in enumerate(prompt_ids):
                row = offset + i
                gen = torch.Generator().manual_seed(self.args.seed * 1_000_003 + self._sampling_calls * 10_007 + row)
                cap = self.SHORT if row >= n_global * self.short_rows_from else self.max_completion_length
                seq, completion = list(ids), []
                # Always `max_completion_length` forwards per row: under FSDP every process must run as many.
                for _ in range(self.max_completion_length):
                    logits = model(input_ids=torch.tensor([seq], device=device)).logits[0, -1]
                    probs = torch.softmax(logits.double().cpu() / self.temperature, dim=-1)
                    u = torch.rand((), generator=gen, dtype=torch.float64)
                    token = min(int(torch.searchsorted(probs.cumsum(0), u)), probs.numel() - 1)
                    seq.append(token)
                    if len(completion) < cap and (not completion or completion[-1] not in eos):
                        completion.append(token)
                if completion[-1] not in eos and len(completion) < self.max_completion_length:
                    completion.append(self.eos_token_ids[0])  # capped rows end like a stopped generation
                completions.append(completion)
        return completions, None

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self._shapes.append({"prompt": output["prompt_ids"].size(1), "completion": output["completion_ids"].size(1)})
        return output


def train_one(method: str, ckpt: str, out: Path, per_device: int, lora: bool, max_steps: int, seed: int):
    base = et.get_trainer_class(method.removesuffix("-global"))
    trainer_cls = type(f"Reproducible{base.__name__}", (ReproducibleSampling, base), {})
    settings = METHOD_SETTINGS.get(method, {})
    args = base.config_class(
        output_dir=str(out), per_device_train_batch_size=per_device, num_generations=4, max_completion_length=8,
        max_steps=max_steps, num_iterations=2, steps_per_generation=1, gradient_accumulation_steps=1,
        learning_rate=0.05, optim="sgd", lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
        report_to=[], use_cpu=True, bf16=False, seed=seed, disable_tqdm=True, gradient_checkpointing=False,
        epsilon_high=0.28 if "kl_cov" not in method else float("inf"), debug_rollout_dir=str(out / "rollouts"),
        **settings,
    )
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    trainer = trainer_cls(model=ckpt, reward_funcs=counted_reward, args=args, train_dataset=dataset,
                          peft_config=peft_config)
    trainer._shapes = []
    FOLDS.update(folded=0, fell_back=0)
    trainer.train()
    trainer.save_model(str(out))
    rank = trainer.accelerator.process_index
    (out / f"shapes_rank{rank}.json").write_text(json.dumps(trainer._shapes))
    (out / f"folds_rank{rank}.json").write_text(json.dumps(FOLDS))
    if trainer.accelerator.is_main_process:
        _, head = trainer.lm_head.of(trainer.model)
        info = {
            "method": method,
            "num_processes": trainer.accelerator.num_processes,
            "distributed_type": str(trainer.accelerator.distributed_type),
            "wrapped": type(trainer.model_wrapped).__name__,
            "mixed_precision": str(trainer.accelerator.mixed_precision),
            "head_weight": type(head.weight).__name__,
            "head_zero3_partitioned": hasattr(head.weight, "ds_id"),
            "log_history": trainer.state.log_history,
        }
        (out / "run.json").write_text(json.dumps(info))
    trainer.accelerator.wait_for_everyone()
    return trainer


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--methods", default=None, help="comma-separated cases (default: `cases()`)")
    parser.add_argument("--global-batch", type=int, default=12)
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--lora-methods", default="", help="Also train these methods with a LoRA adapter (lora-<m>/).")
    parser.add_argument("--seed", type=int, default=7)
    a = parser.parse_args(argv)
    from accelerate import PartialState

    state = PartialState(cpu=True)  # without cpu=True a CPU launch is not seen as distributed (no CUDA)
    per_device = a.global_batch // state.num_processes
    count_folds()
    methods = a.methods.split(",") if a.methods is not None else cases()
    runs = [(m, False) for m in methods if m] + [(m, True) for m in a.lora_methods.split(",") if m]
    trainer = None
    for method, lora in runs:
        out = Path(a.out) / (f"lora-{method}" if lora else method)
        trainer = train_one(method, a.ckpt, out, per_device, lora, a.max_steps, a.seed)
    if trainer is not None:
        trainer.accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())

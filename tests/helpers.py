"""Shared builders for trainer tests: a saved toy checkpoint, a tiny dataset and a cheap reward."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from datasets import Dataset

import exploration_trl
from exploration_trl.rewards import record_outcomes
from exploration_trl.toy import build_toy, save_toy

PROMPTS = ["ab", "ba", "abc", "cab", "bca", "acb", "cc", "aa"]


def child_pythonpath(*folders) -> str:
    """PYTHONPATH for a child process: `folders`, then the folder of the `exploration_trl` this session imports, so
    that the child runs the package under test, not another checkout the environment has installed."""
    return os.pathsep.join([*map(str, folders), str(Path(exploration_trl.__file__).resolve().parents[1])])


def toy_checkpoint(path, seed=0, **kwargs):
    model, tok = build_toy("abc", seed=seed, **kwargs)
    return str(save_toy(model, tok, path))


def toy_dataset(n=8):
    return Dataset.from_dict({"prompt": [PROMPTS[i % len(PROMPTS)] for i in range(n)], "answer": ["a"] * n})


def letter_reward(completions, **kwargs):
    """Fraction of 'a' characters: a graded, non-binary reward with within-group variance. Its "final answer" (for
    outcome_explore) is the completion's first character."""
    record_outcomes("letter_reward", [c[:1] or None for c in completions])
    return [c.count("a") / max(len(c), 1) for c in completions]


def binary_reward(completions, **kwargs):
    return [1.0 if c.count("a") >= c.count("b") and len(c) > 0 else 0.0 for c in completions]


def grpo_kwargs(output_dir, **overrides):
    kw = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=3,
        learning_rate=5e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=42,
        bf16=False,
        disable_tqdm=True,
    )
    kw.update(overrides)
    return kw


def train(trainer_cls, config_cls, ckpt, output_dir, reward=letter_reward, dataset=None, **overrides):
    args = config_cls(**grpo_kwargs(output_dir, **overrides))
    trainer = trainer_cls(model=ckpt, reward_funcs=reward, args=args, train_dataset=dataset or toy_dataset())
    trainer.train()
    return trainer


def max_param_diff(a, b):
    pa = dict(a.model.named_parameters())
    return max((pa[n].detach() - p.detach()).abs().max().item() for n, p in b.model.named_parameters())


def params_changed(trainer, ckpt):
    from transformers import AutoModelForCausalLM

    ref = dict(AutoModelForCausalLM.from_pretrained(ckpt).named_parameters())
    return max((ref[n] - p.detach()).abs().max().item() for n, p in trainer.model.named_parameters())


def distinct_char_reward(completions, **kwargs):
    """Distinct characters per completion: varies within groups even for an untrained toy model. Its "final answer"
    (for outcome_explore) is the completion's last character."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    record_outcomes("distinct_char_reward", [t[-1:] or None for t in texts])
    return [len(set(t)) / 8 for t in texts]


# `exploration-trl train` in tests: a one-step toy run, and the one error line a mistake prints.
CLI_BASE = {
    "method": "grpo",
    "model_name_or_path": "toy",
    "dataset_name": "countdown",
    "max_train_samples": 8,
    "reward_funcs": ["countdown"],
    "use_cpu": True,
    "max_steps": 1,
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 4,
    "save_strategy": "no",
    "report_to": "none",
}


def write_yaml(tmp_path, name="cfg.yaml", **changes):
    """A training YAML: `CLI_BASE` with `changes` (a None value drops the key), output in `tmp_path/out`."""
    cfg = {**CLI_BASE, "output_dir": str(tmp_path / "out"), **changes}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def run_error(capsys, argv, status=2):
    """Run the CLI; assert it failed with `status`, no traceback and exactly one `error:` line, and return it."""
    from exploration_trl.cli import main

    assert main(argv) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err  # one error line (progress bars of dataset loading may precede it)
    return lines[0]


def builtin_methods() -> list[str]:
    """The registered methods defined in the package (not one a test registered), in registration order."""
    from exploration_trl.methods import METHODS, strategy_of

    return [name for name, (trainer, _) in METHODS.items()
            if (strategy_of(name) or trainer).__module__.startswith("exploration_trl.")]


def cases_with(table) -> list[str]:
    """A driver's cases: the keys of its `table` (cases with their own settings), then every built-in method that has
    none, so that a new method's module is run without an edit to the driver."""
    return [*table, *(m for m in builtin_methods() if m not in table)]

"""`exploration-trl` command line: train, eval, compare, tree, countdown-tiny, push.

`train` parses a TRL-style YAML with TRL's `TrlParser` (`--config file.yaml`, then `--key value` overrides).
The `method` key picks the trainer/config pair (`grpo`, `progrpo`, `dsgrpo`, `casp`, `kl_cov`, `clip_cov`,
or `advantage+loss` such as `progrpo+casp`). It also runs under accelerate:
`accelerate launch -m exploration_trl.cli train --config ...`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

TOY_MODEL = "toy"


from .errors import HookDidNotRunError


class CLIError(ValueError):
    """Bad user input: printed as one `error: ...` line, exit status 2."""


@dataclass
class ScriptArguments:
    """Keys of the training YAML that are not `GRPOConfig` / `ModelConfig` fields."""

    method: str = field(default="grpo", metadata={"help": "grpo, progrpo, dsgrpo, casp, kl_cov, clip_cov, or adv+loss."})
    dataset_name: str = field(
        default="countdown", metadata={"help": "Built-in name (countdown, or a benchmark), Hub dataset, or local jsonl/parquet."}
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_prompt_column: str = field(default="prompt", metadata={"help": "Column holding the prompt."})
    dataset_prompt_template: str | None = field(
        default=None,
        metadata={"help": "Turn a plain-text prompt into a chat message: a format string with {prompt}, e.g. "
                  "'{prompt}\\nPlease reason step by step, and put your final answer within \\boxed{}.'"},
    )
    system_prompt: str | None = field(default=None, metadata={"help": "System message prepended to chat prompts."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only this many training rows."})
    reward_funcs: list[str] | None = field(
        default=None, metadata={"help": "Reward names (see `exploration_trl.rewards`) or dotted paths.", "nargs": "+"}
    )
    reward_kwargs: str | None = field(
        default=None, metadata={"help": "JSON mapping reward name -> keyword arguments for its factory."}
    )
    toy_alphabet: str = field(default="", metadata={"help": "Extra characters for the built-in toy tokenizer."})


def _dataclass_keys(*classes) -> list[str]:
    return sorted({f.name for c in classes for f in fields(c)})


def _unknown_key_error(keys, known, where):
    key = keys[0]
    from .trainers import METHODS

    owner = next((m for m, (_, cfg) in METHODS.items() if key in cfg.__dataclass_fields__), None)
    if owner:
        return CLIError(f"key '{key}' in {where} is a {owner} setting; set `method: {owner}` (or compose, e.g. "
                        f"progrpo+{owner}) to use it")
    hint = difflib.get_close_matches(key, known, n=1)
    suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
    return CLIError(f"unknown key '{key}' in {where}{suggestion}; run `exploration-trl train --help` for the allowed keys")


def _read_yaml(path: str) -> dict:
    import yaml

    if not Path(path).is_file():
        raise CLIError(f"config file '{path}' not found")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise CLIError(f"config file '{path}' must hold a YAML mapping of key: value")
    return data


def _method_from(argv: list[str]) -> str:
    """The method decides the config class, so read it before building the parser (CLI beats YAML)."""
    for i, a in enumerate(argv):
        if a == "--method" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--method="):
            return a.split("=", 1)[1]
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        return str(_read_yaml(argv[argv.index("--config") + 1]).get("method", "grpo"))
    return "grpo"


def parse_train_args(argv: list[str]):
    """Parse `train` arguments into `(script_args, training_args, model_args)`, with one-line errors.

    Group layout (`num_generations >= 2`, a generation batch divisible into groups) is validated by TRL's
    `GRPOConfig.__post_init__` while parsing; its message becomes the error line.
    """
    from trl import ModelConfig, TrlParser

    from .trainers import get_config_class

    try:
        config_cls = get_config_class(_method_from(argv))
    except ValueError as e:
        raise CLIError(str(e)) from None
    parser = TrlParser((ScriptArguments, config_cls, ModelConfig), prog="exploration-trl train")
    known = _dataclass_keys(ScriptArguments, config_cls, ModelConfig)
    if "--config" in argv:
        where = argv[argv.index("--config") + 1]
        config = _read_yaml(where)
        unknown = [k for k in config if k not in known and k != "env"]
        if unknown:
            raise _unknown_key_error(unknown, known, where)
    try:
        script_args, training_args, model_args, rest = parser.parse_args_and_config(argv, return_remaining_strings=True)
    except ValueError as e:
        raise CLIError(str(e).splitlines()[0]) from None
    if rest:
        raise _unknown_key_error([r.lstrip("-").split("=")[0] for r in rest], known, "the command line")
    return script_args, training_args, model_args


# ---------------------------------------------------------------------------------------------- dataset
def load_train_dataset(script_args, training_args):
    """Built-in name, local jsonl/json/parquet/csv file, or Hub dataset; validated against the prompt column."""
    from .data.builtin import BUILTIN_DATASETS

    name = script_args.dataset_name
    default_rewards: list[str] = []
    if name in BUILTIN_DATASETS:
        builder, default_rewards = BUILTIN_DATASETS[name]
        dataset = builder(seed=training_args.seed)
    elif Path(name).suffix in (".jsonl", ".json", ".parquet", ".csv"):
        if not Path(name).is_file():
            raise CLIError(f"dataset_name '{name}': file not found")
        from datasets import load_dataset

        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}[Path(name).suffix]
        dataset = load_dataset(kind, data_files=name, split="train")
    else:
        dataset, default_rewards = _benchmark_or_hub(name, script_args)
    if script_args.dataset_prompt_column not in dataset.column_names:
        raise CLIError(
            f"dataset '{name}' has no column '{script_args.dataset_prompt_column}' (columns: "
            f"{', '.join(dataset.column_names)}); set dataset_prompt_column to the prompt column"
        )
    if script_args.dataset_prompt_column != "prompt":
        dataset = dataset.rename_column(script_args.dataset_prompt_column, "prompt")
    if script_args.max_train_samples is not None:
        dataset = dataset.select(range(min(script_args.max_train_samples, len(dataset))))
    if script_args.dataset_prompt_template or script_args.system_prompt:
        dataset = dataset.map(lambda row: {"prompt": _chat_prompt(row["prompt"], script_args)})
    return dataset, default_rewards


def _chat_prompt(prompt, script_args) -> list[dict]:
    """Apply `dataset_prompt_template` / `system_prompt`, giving a conversational prompt TRL renders with the
    model's chat template (raw Hub questions otherwise reach an instruct model with no answer-format request)."""
    messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    template = script_args.dataset_prompt_template
    if template:
        if "{prompt}" not in template:
            raise CLIError("dataset_prompt_template must contain {prompt} (where the question goes)")
        last = messages[-1]
        messages[-1] = {**last, "content": template.replace("{prompt}", last["content"])}
    if script_args.system_prompt and messages[0].get("role") != "system":
        messages.insert(0, {"role": "system", "content": script_args.system_prompt})
    return messages


def _benchmark_or_hub(name, script_args):
    from datasets import Dataset, load_dataset

    try:
        from .eval.benchmarks import BUILTIN_BENCHMARKS, load_benchmark
    except ImportError:  # pragma: no cover - eval is part of the package
        BUILTIN_BENCHMARKS = {}
    if name in BUILTIN_BENCHMARKS:
        bench = load_benchmark(name)
        return Dataset.from_list([{k: v for k, v in r.items() if k != "id"} for r in bench.records]), [bench.reward]
    try:
        return load_dataset(name, script_args.dataset_config, split=script_args.dataset_train_split), []
    except Exception as e:  # noqa: BLE001 - any loading failure becomes one line
        raise CLIError(f"could not load dataset '{name}': {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


# ---------------------------------------------------------------------------------------------- rewards/model
def resolve_reward_funcs(script_args, default_rewards):
    from .rewards import resolve_rewards

    names = script_args.reward_funcs or default_rewards
    if not names:
        raise CLIError("reward_funcs is empty; list reward names (e.g. [math_accuracy, format]) or dotted paths")
    try:
        kwargs = json.loads(script_args.reward_kwargs) if isinstance(script_args.reward_kwargs, str) else script_args.reward_kwargs
    except json.JSONDecodeError as e:
        raise CLIError(f"reward_kwargs is not valid JSON: {e.msg}") from None
    try:
        return resolve_rewards(names, kwargs)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _toy_model(training_args, script_args):
    """`model_name_or_path: toy` builds the offline toy backbone into `<output_dir>/toy_base`."""
    from accelerate import PartialState

    from .toy import make_toy_checkpoint

    path = Path(training_args.output_dir) / "toy_base"
    with PartialState().main_process_first():  # under accelerate launch, one process writes it
        if not (path / "model.safetensors").exists():
            make_toy_checkpoint(path, alphabet=script_args.toy_alphabet, seed=training_args.seed)
    return str(path)


def train_main(argv: list[str]) -> int:
    script_args, training_args, model_args = parse_train_args(argv)
    from trl import get_peft_config

    from .trainers import get_trainer_class

    trainer_cls = get_trainer_class(script_args.method)
    dataset, default_rewards = load_train_dataset(script_args, training_args)
    reward_funcs = resolve_reward_funcs(script_args, default_rewards)
    model = model_args.model_name_or_path or TOY_MODEL
    if model == TOY_MODEL:
        model = _toy_model(training_args, script_args)
    elif model_args.dtype not in (None, "auto"):
        training_args.model_init_kwargs = {**(training_args.model_init_kwargs or {}), "dtype": model_args.dtype}
    # `push_to_hub: true` pushes once, at the end, with our model card (`exploration_trl.hub`); the HF Trainer's own
    # push (which creates the repo at start-up and pushes on every save) is switched off.
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        _write_card(trainer, script_args, model_args, model)
    if push_to_hub and trainer.accelerator.is_main_process:
        from .hub import push_output_dir

        push_output_dir(training_args.output_dir, training_args.hub_model_id)
    # Leave the process group cleanly: exiting with it alive lets gloo's threads be torn down at interpreter exit,
    # which aborts the process ("terminate called without an active exception") after a successful run.
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return 0


def _write_card(trainer, script_args, model_args, model):
    try:
        from .hub import write_model_card
    except ImportError:
        trainer.create_model_card(model_name=Path(trainer.args.output_dir).name)
        return
    write_model_card(
        trainer.args.output_dir,
        method=script_args.method,
        base_model=model,
        dataset=script_args.dataset_name,
        training_args=trainer.args,
        log_history=trainer.state.log_history,
        is_adapter=model_args.use_peft,
    )


# ---------------------------------------------------------------------------------------------- main
SUBCOMMAND_MODULES = (
    "exploration_trl.eval.command",
    "exploration_trl.experiments.tree",
    "exploration_trl.experiments.countdown_tiny",
    "exploration_trl.hub.command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exploration-trl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="Train with a TRL-style YAML (--config) and --key value overrides.", add_help=False)
    train.set_defaults(func=None)
    for module in SUBCOMMAND_MODULES:
        try:
            importlib.import_module(module).register(sub)
        except ImportError:
            continue
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "train":
            if "--help" in argv[1:] or "-h" in argv[1:]:
                from trl import ModelConfig, TrlParser

                from .trainers import get_config_class

                TrlParser((ScriptArguments, get_config_class(_method_from(argv[1:])), ModelConfig),
                          prog="exploration-trl train").print_help()
                return 0
            return train_main(argv[1:])
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except (CLIError, ValueError, FileNotFoundError) as e:
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    except HookDidNotRunError as e:  # not a user mistake: one line naming the method, and a non-zero exit
        # Raised mid-training: start a fresh line, since a progress bar may hold the current one.
        print(f"\nerror: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""`train`'s arguments: the YAML and `--key value` overrides read into `(script_args, training_args, model_args)`
with TRL's `TrlParser`, every mistake a one-line `CLIError` found before any model loads."""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass, field, fields

from .common import CLIError, is_main_process
from .yaml_config import allows_none, coerce_value, config_path, example_value, method_from, normalise_argv, read_yaml


@dataclass
class ScriptArguments:
    """Keys of the training YAML that are not `GRPOConfig` / `ModelConfig` fields."""

    method: str = field(default="grpo", metadata={"help": "A name of `methods` above, or advantage+loss as shown there."})
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


# ---------------------------------------------------------------------------------------------- parsing
def _parser_class():
    from trl import TrlParser

    class Parser(TrlParser):
        """TRL's parser, but a bad value is a `CLIError` line instead of 230 lines of usage and `SystemExit`."""

        def error(self, message):
            raise CLIError(_argparse_message(message))

    return Parser


def _argparse_message(message: str) -> str:
    m = re.match(r"argument (--[\w-]+)(?:/--[\w-]+)?: invalid (\S+) value: '(.*)'$", message)
    if m:
        flag, kind, value = m.groups()
        what = {"float": "a number", "int": "a whole number", "string_to_bool": "true or false"}.get(kind, f"a {kind}")
        return f"{flag} {value!r} on the command line is not {what}; give e.g. {flag} {example_value(kind)}"
    m = re.match(r"argument (--[\w-]+)(?:/--[\w-]+)?: (expected .*)$", message)
    if m:
        return f"{m.group(1)} on the command line: {m.group(2)}; give it a value, e.g. {m.group(1)} VALUE"
    return f"{message}; run `exploration-trl train --help`"


def _dataclass_keys(*classes) -> list[str]:
    return sorted({f.name for c in classes for f in fields(c)})


def _unknown_key_error(keys, known, where):
    key = keys[0]
    from ..trainers import METHODS
    from ..trainers.composition import example_composition

    owner = next((m for m, (_, cfg) in METHODS.items() if key in cfg.__dataclass_fields__), None)
    if owner:
        return CLIError(f"key '{key}' in {where} is a {owner} setting; set `method: {owner}` (or compose, e.g. "
                        f"{example_composition(owner)}) to use it")
    hint = difflib.get_close_matches(key, known, n=1)
    suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
    return CLIError(f"unknown key '{key}' in {where}{suggestion}; `exploration-trl train --help` lists the method keys "
                    "and `--help-all` every TRL/transformers key")


def _has_accelerator() -> bool:
    from ..trainers.config import has_accelerator

    return has_accelerator()


def _device_defaults(parser, config: dict, argv: list[str]) -> str | None:
    """On a machine with no GPU, train on the CPU in float32 unless the YAML or the command line says otherwise
    (transformers would stop at `bf16` with "Your setup doesn't support bf16/gpu"). Returns the info line to print
    once parsing succeeded (None: nothing was chosen)."""
    given = set(config) | {a.lstrip("-").split("=")[0].replace("-", "_") for a in argv if a.startswith("--")}
    defaults = {k: v for k, v in (("use_cpu", True), ("bf16", False)) if k not in given}
    if not defaults or _has_accelerator():
        return None
    parser.set_defaults(**defaults)
    chosen = ", ".join(f"{k}: {str(v).lower()}" for k, v in defaults.items())
    precision = " in float32" if "bf16" in defaults else ""
    return (f"info: no GPU found, so training runs on the CPU{precision} ({chosen}); set "
            f"{'them' if len(defaults) > 1 else 'it'} in the YAML to choose otherwise")


def parse_train_args(argv: list[str]):
    """Parse `train` arguments into `(script_args, training_args, model_args)`, with one-line errors.

    Group layout (`num_generations >= 2`, a generation batch divisible into groups) is validated by TRL's
    `GRPOConfig.__post_init__` while parsing; its message becomes the error line, as do the method configs' checks
    (negative weights, `temperature: 0`, ...).
    """
    return parse_train_args_and_trainer(argv)[1:]


def parse_train_args_and_trainer(argv: list[str]):
    """`parse_train_args`, with the trainer class of the run's method first: `(trainer_cls, script_args,
    training_args, model_args)`. The method string is resolved here once; its config class is the trainer's."""
    from trl import ModelConfig

    from ..trainers import get_trainer_class

    argv = normalise_argv(argv)
    try:
        trainer_cls = get_trainer_class(method_from(argv))
    except ValueError as e:
        raise CLIError(str(e)) from None
    config_cls = trainer_cls.config_class
    classes = (ScriptArguments, config_cls, ModelConfig)
    parser = _parser_class()(classes, prog="exploration-trl train")
    known = _dataclass_keys(*classes)
    path = config_path(argv)
    config, rest = {}, list(argv)
    if path is not None:
        config = read_yaml(path)
        unknown = [k for k in config if k not in known and k != "env"]
        if unknown:
            raise _unknown_key_error(unknown, known, path)
        actions = {a.dest: a for a in parser._actions}
        for key, value in list(config.items()):
            if key == "env":
                continue
            if value is None and not allows_none(classes, key):
                raise CLIError(f"{key} in {path} is null; give it a value or remove the key (default: "
                               f"{actions[key].default})")
            config[key] = coerce_value(key, value, actions[key], path) if value is not None else None
        i = rest.index("--config")
        del rest[i:i + 2]
    info = _device_defaults(parser, config, rest)
    env = config.pop("env", None) or {}
    if not isinstance(env, dict):
        raise CLIError(f"env in {path} must be a mapping of VARIABLE: value")
    for name, value in env.items():
        os.environ[name] = str(value)
    parser.set_defaults_with_config(**config)
    try:
        script_args, training_args, model_args, rest = parser.parse_args_into_dataclasses(
            args=rest, return_remaining_strings=True
        )
    except ValueError as e:
        raise CLIError(str(e).strip().splitlines()[0]) from None
    if rest:
        raise _unknown_key_error([r.lstrip("-").split("=")[0] for r in rest], known, "the command line")
    if info and is_main_process():
        print(info, file=sys.stderr)
    return trainer_cls, script_args, training_args, model_args

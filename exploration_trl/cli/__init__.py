"""`exploration-trl` command line (its subcommands: `exploration-trl --help`).

`train` reads a TRL-style YAML (`--config file.yaml`, then `--key value` overrides) into TRL's dataclasses with
TRL's `TrlParser`. The `method` key picks the trainer/config pair (a registered method, or `advantage+loss`; `train
--help` lists them). It also runs under accelerate:
`accelerate launch -m exploration_trl.cli train --config ...`.

A user's mistake is one line, `error: <what is wrong> <how to fix it>`, exit status 2, found before any model loads
wherever it can be. An exception raised by the user's own code (a reward function) keeps its traceback.

One module a job, each importing only the ones listed before it:

- `common`: `CLIError` and which process prints;
- `yaml_config`: the `--config` file read, its method, its values checked against their keys' types;
- `train_args`: `ScriptArguments` and `parse_train_args`;
- `train_help_text`: `train --help` and `--help-all`;
- `train_data`: the dataset, reward and prompt-length checks;
- `train`: `train_main`;
- `entry_point`: `main`, `build_parser` and `SUBCOMMAND_MODULES` (the other subcommands' `register(subparsers)`).

Beside them, `config_reference` writes docs/config_reference.md from the config dataclasses and the method registry
(`python -m exploration_trl.cli.config_reference`); nothing imports it.
"""

from .common import CLIError
from .entry_point import SUBCOMMAND_MODULES, build_parser, main
from .train import TOY_MODEL, check_model_and_engine, train_main
from .train_args import ScriptArguments, parse_train_args
from .train_data import check_prompt_lengths, check_rewards, load_train_dataset, resolve_reward_funcs
from .train_help_text import COMMON_KEYS, method_summaries, train_help

__all__ = [
    "COMMON_KEYS",
    "CLIError",
    "SUBCOMMAND_MODULES",
    "ScriptArguments",
    "TOY_MODEL",
    "build_parser",
    "check_model_and_engine",
    "check_prompt_lengths",
    "check_rewards",
    "load_train_dataset",
    "main",
    "method_summaries",
    "parse_train_args",
    "resolve_reward_funcs",
    "train_help",
    "train_main",
]

"""`exploration-trl train --help` (the methods and their keys) and `--help-all` (every TRL/transformers key)."""

from __future__ import annotations

import re
import textwrap
from dataclasses import MISSING, fields

from .common import CLIError
from .train_args import ScriptArguments
from .yaml_config import method_from

#: The first lines of `train --help`, also printed above the error of a `train` given neither a YAML nor a model.
USAGE = ("usage: exploration-trl train --config FILE.yaml [--KEY VALUE ...]\n"
         "       exploration-trl train --model_name_or_path MODEL [--KEY VALUE ...]\n"
         "       accelerate launch [--config_file ACCELERATE.yaml] -m exploration_trl.cli train --config FILE.yaml")
#: TRL / transformers keys most runs set (all of them: `--help-all`).
COMMON_KEYS = ("model_name_or_path", "output_dir", "learning_rate", "max_steps", "num_train_epochs",
               "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
               "max_completion_length", "temperature", "beta", "loss_type", "reward_weights", "logging_steps",
               "save_strategy", "report_to", "seed", "bf16", "use_cpu", "use_vllm", "use_peft", "lora_r",
               "lora_alpha", "lora_target_modules", "push_to_hub", "hub_model_id")


def method_summaries() -> dict[str, str]:
    """`{method: one line}` for every registered method: its record's summary and the side it acts on."""
    from ..methods import method_info
    from ..trainers import METHODS  # importing the trainers registers the built-in methods

    infos = [method_info(name) for name in METHODS]
    return {i.name: i.summary + ("" if i.side == "none" else f" ({i.side} side)") for i in infos}


def _default(f) -> object:
    value = f.default_factory() if f.default_factory is not MISSING else f.default
    return getattr(value, "value", value)


def _key_lines(items, first_sentence: bool = False, width: int = 116) -> list[str]:
    """`  key = default   help` rows, the help wrapped under a fixed column (or cut to its first sentence)."""
    lines = []
    for name, default, text in items:
        head = f"  {name} = {default!r}"
        text = " ".join(str(text or "").split())
        if first_sentence:
            text = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
        body = textwrap.wrap(text, width - 40) or [""]
        if len(head) > 38:
            lines.append(head)
            head = ""
        lines.append(f"{head:<40}{body[0]}".rstrip())
        lines += [" " * 40 + b for b in body[1:]]
    return lines


def train_help() -> str:
    """`exploration-trl train --help`: usage, `--config`, the methods, each method's own keys with their defaults
    (and the TRL defaults its preset changes), the keys every method shares, and a pointer to `--help-all`."""
    from trl import GRPOConfig, ModelConfig

    from ..methods import method_info
    from ..trainers import METHODS, ExplorationGRPOConfig
    from ..trainers.composition import LOSS_SIDE, example_composition

    base_fields = ExplorationGRPOConfig.__dataclass_fields__
    out = [
        *USAGE.splitlines(),
        "",
        "Train with GRPO or an exploration-preserving method (TRL GRPOTrainer subclasses). Every key below is a key",
        "of the YAML given to --config; --KEY VALUE on the command line overrides it.",
        "",
        "options:",
        "  --config FILE                         the training YAML; recipes: configs/methods/<method>_<model>.yaml",
        "  --KEY VALUE                           override one key, e.g. --max_steps 10 --learning_rate 1e-6",
        "  -h, --help                            this help",
        "  --help-all                            every key: TRL's GRPOConfig, transformers' TrainingArguments and",
        "                                        TRL's ModelConfig (~1,400 lines)",
        "",
        "methods (`method: NAME`; one advantage-side and one loss-side method compose, e.g. "
        f"{example_composition(next(iter(LOSS_SIDE), ''))}):",
    ]
    out += [f"  {name:<38}{text}" for name, text in method_summaries().items()]
    out += ["", "data and rewards:"]
    out += _key_lines((f.name, _default(f), f.metadata.get("help")) for f in fields(ScriptArguments))
    for name, (_, cfg) in METHODS.items():
        if method_info(name).side == "none":
            continue
        own = [f for f in fields(cfg) if f.name not in base_fields]
        preset = [f for f in fields(cfg) if f.name in base_fields and f.name in GRPOConfig.__dataclass_fields__
                  and _default(f) != _default(base_fields[f.name])]
        out += ["", f"{name} keys (method: {name}):"]
        out += _key_lines((f.name, _default(f), f.metadata.get("help")) for f in own)
        if preset:
            out.append("  its preset changes TRL's defaults: "
                       + ", ".join(f"{f.name} = {_default(f)!r}" for f in preset))
    shared = [f for f in fields(ExplorationGRPOConfig)
              if f.name not in GRPOConfig.__dataclass_fields__]
    out += ["", "any method (STILL shapers, what counts as correct, exploration metrics):"]
    out += _key_lines((f.name, _default(f), f.metadata.get("help")) for f in shared)
    trl_fields = {**GRPOConfig.__dataclass_fields__, **ExplorationGRPOConfig.__dataclass_fields__,
                  **ModelConfig.__dataclass_fields__}
    out += ["", "common TRL / transformers keys (defaults as in TRL's GRPOConfig; all keys: --help-all):"]
    out += _key_lines(((k, _default(trl_fields[k]), trl_fields[k].metadata.get("help")) for k in COMMON_KEYS
                       if k in trl_fields), first_sentence=True)
    out += ["", "Examples: configs/methods/*.yaml. Docs: README.md (Methods, Rewards, Training-time metrics)."]
    return "\n".join(out)


def print_help_all(argv: list[str]) -> None:
    from trl import ModelConfig, TrlParser

    from ..trainers import get_config_class

    try:
        method = method_from(argv)
    except CLIError:
        method = "grpo"
    parser = TrlParser((ScriptArguments, get_config_class(method), ModelConfig), prog="exploration-trl train")
    for action in parser._actions:  # argparse %-formats help: a bare `95%` in a key's help would crash it
        if action.help:
            action.help = re.sub(r"%%|%(?!\()", "%%", action.help)
    parser.print_help()

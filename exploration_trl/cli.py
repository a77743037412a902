"""`exploration-trl` command line: train, eval, compare, tree, countdown-tiny, push.

`train` reads a TRL-style YAML (`--config file.yaml`, then `--key value` overrides) into TRL's dataclasses with
TRL's `TrlParser`. The `method` key picks the trainer/config pair (`grpo`, `progrpo`, `dsgrpo`, `casp`, `kl_cov`,
`clip_cov`, or `advantage+loss` such as `progrpo+casp`). It also runs under accelerate:
`accelerate launch -m exploration_trl.cli train --config ...`.

A user's mistake is one line, `error: <what is wrong> <how to fix it>`, exit status 2, found before any model loads
wherever it can be. An exception raised by the user's own code (a reward function) keeps its traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import re
import sys
import textwrap
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from .errors import HookDidNotRunError

TOY_MODEL = "toy"


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
        return f"{flag} {value!r} on the command line is not {what}; give e.g. {flag} {_example(kind)}"
    m = re.match(r"argument (--[\w-]+)(?:/--[\w-]+)?: (expected .*)$", message)
    if m:
        return f"{m.group(1)} on the command line: {m.group(2)}; give it a value, e.g. {m.group(1)} VALUE"
    return f"{message}; run `exploration-trl train --help`"


def _example(kind: str) -> str:
    return {"float": "1e-6", "int": "10", "string_to_bool": "true"}.get(kind, "VALUE")


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
    return CLIError(f"unknown key '{key}' in {where}{suggestion}; `exploration-trl train --help` lists the method keys "
                    "and `--help-all` every TRL/transformers key")


def _config_path(argv: list[str]) -> str | None:
    if "--config" not in argv:
        return None
    i = argv.index("--config")
    if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
        raise CLIError("--config needs a YAML file, e.g. exploration-trl train --config configs/smoke_toy_countdown.yaml")
    return argv[i + 1]


def _read_yaml(path: str) -> dict:
    import yaml

    if not Path(path).is_file():
        raise CLIError(f"config file '{path}' not found")
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise CLIError(f"config file '{path}' is not valid YAML{where} ({problem}); fix the syntax there") from None
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
    path = _config_path(argv)
    if path is not None:
        return str(_read_yaml(path).get("method", "grpo"))
    return "grpo"


def _normalise_argv(argv: list[str]) -> list[str]:
    """`--config=FILE` -> `--config FILE` (TRL's parser reads only the second form)."""
    out = []
    for a in argv:
        out += a.split("=", 1) if a.startswith("--config=") else [a]
    return out


def _allows_none(classes, key: str) -> bool:
    for cls in classes:
        if key in cls.__dataclass_fields__:
            try:
                hint = typing.get_type_hints(cls)[key]
            except Exception:  # noqa: BLE001 - unresolvable annotations: do not second-guess them
                return True
            return type(None) in typing.get_args(hint) or hint is typing.Any
    return True


def _coerce_value(key: str, value, action, where: str):
    """`value` of YAML key `key` as its field's type, or a `CLIError` naming key, value and a valid example.

    TRL hands YAML values to the dataclasses untyped (`max_steps: 2.5` then fails deep inside training), so they are
    checked here against the type argparse would apply on the command line. YAML reads `1e-6` as a string; a string
    that is a number is accepted for a number."""
    kind = getattr(action.type, "__name__", None)
    if kind not in ("int", "float", "string_to_bool") and not action.choices:
        return value
    if isinstance(value, (list, tuple)) and action.nargs in ("+", "*"):
        return [_coerce_value(key, v, argparse.Namespace(type=action.type, choices=action.choices, nargs=None), where)
                for v in value]
    if kind == "int" or kind == "float":
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
        if kind == "int" and number is not None and float(number).is_integer():
            return int(number)
        if kind == "float" and number is not None:
            return number if isinstance(value, (int, float)) else float(number)  # YAML's own numbers stay as they are
        what = "a whole number" if kind == "int" else "a number"
        raise CLIError(f"{key} in {where} must be {what}, got {value!r}; write e.g. {key}: {_example(kind)}")
    if kind == "string_to_bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "yes", "1", "false", "no", "0"):
            return text in ("true", "yes", "1")
        raise CLIError(f"{key} in {where} must be true or false, got {value!r}")
    allowed = [str(getattr(c, "value", c)) for c in action.choices]
    if str(getattr(value, "value", value)) not in allowed:
        raise CLIError(f"{key} in {where} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def _has_accelerator() -> bool:
    from .trainers.base import has_accelerator

    return has_accelerator()


def _is_main_process() -> bool:
    return os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) == "0"


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
    from trl import ModelConfig

    from .trainers import get_config_class

    argv = _normalise_argv(argv)
    try:
        config_cls = get_config_class(_method_from(argv))
    except ValueError as e:
        raise CLIError(str(e)) from None
    classes = (ScriptArguments, config_cls, ModelConfig)
    parser = _parser_class()(classes, prog="exploration-trl train")
    known = _dataclass_keys(*classes)
    path = _config_path(argv)
    config, rest = {}, list(argv)
    if path is not None:
        config = _read_yaml(path)
        unknown = [k for k in config if k not in known and k != "env"]
        if unknown:
            raise _unknown_key_error(unknown, known, path)
        actions = {a.dest: a for a in parser._actions}
        for key, value in list(config.items()):
            if key == "env":
                continue
            if value is None and not _allows_none(classes, key):
                raise CLIError(f"{key} in {path} is null; give it a value or remove the key (default: "
                               f"{actions[key].default})")
            config[key] = _coerce_value(key, value, actions[key], path) if value is not None else None
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
    if info and _is_main_process():
        print(info, file=sys.stderr)
    return script_args, training_args, model_args


# ---------------------------------------------------------------------------------------------- --help
METHOD_SUMMARIES = {
    "grpo": "TRL's GRPO unchanged, plus exploration metrics",
    "progrpo": "ProGRPO / ARM: confidence-reweighted advantages in mixed groups (advantage side)",
    "dsgrpo": "DS-GRPO: entropy bonus on correct completions, penalty on wrong ones (advantage side)",
    "casp": "CaSP: positive gradient spread over the top-N candidates at forking tokens (loss side)",
    "kl_cov": "KL-Cov: |logp - old_logp| penalty on the highest-covariance tokens (loss side)",
    "clip_cov": "Clip-Cov: a random share of high-covariance tokens loses its gradient (loss side)",
}
#: TRL / transformers keys most runs set (all of them: `--help-all`).
COMMON_KEYS = ("model_name_or_path", "output_dir", "learning_rate", "max_steps", "num_train_epochs",
               "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
               "max_completion_length", "temperature", "beta", "loss_type", "reward_weights", "logging_steps",
               "save_strategy", "report_to", "seed", "bf16", "use_cpu", "use_vllm", "use_peft", "lora_r",
               "lora_alpha", "lora_target_modules", "push_to_hub", "hub_model_id")


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
    from trl import ModelConfig, GRPOConfig

    from .trainers import METHODS, ExplorationGRPOConfig

    base_fields = ExplorationGRPOConfig.__dataclass_fields__
    out = [
        "usage: exploration-trl train --config FILE.yaml [--KEY VALUE ...]",
        "       accelerate launch [--config_file ACCELERATE.yaml] -m exploration_trl.cli train --config FILE.yaml",
        "",
        "Train with GRPO or an exploration-preserving method (TRL GRPOTrainer subclasses). Every key below is a key",
        "of the YAML given to --config; --KEY VALUE on the command line overrides it.",
        "",
        "options:",
        "  --config FILE                         the training YAML, e.g. configs/methods/casp_qwen2.5-0.5b.yaml",
        "  --KEY VALUE                           override one key, e.g. --max_steps 10 --learning_rate 1e-6",
        "  -h, --help                            this help",
        "  --help-all                            every key: TRL's GRPOConfig, transformers' TrainingArguments and",
        "                                        TRL's ModelConfig (~1,400 lines)",
        "",
        "methods (`method: NAME`; one advantage-side and one loss-side method compose, e.g. progrpo+casp):",
    ]
    out += [f"  {name:<38}{text}" for name, text in METHOD_SUMMARIES.items()]
    out += ["", "data and rewards:"]
    out += _key_lines((f.name, _default(f), f.metadata.get("help")) for f in fields(ScriptArguments))
    for name, (_, cfg) in METHODS.items():
        if name == "grpo":
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


def _print_help_all(argv: list[str]) -> None:
    from trl import ModelConfig, TrlParser

    from .trainers import get_config_class

    try:
        method = _method_from(argv)
    except CLIError:
        method = "grpo"
    TrlParser((ScriptArguments, get_config_class(method), ModelConfig), prog="exploration-trl train").print_help()


# ---------------------------------------------------------------------------------------------- dataset
def load_train_dataset(script_args, training_args):
    """Built-in name, local jsonl/json/parquet/csv file, or Hub dataset; validated against the prompt column."""
    from .data.builtin import BUILTIN_DATASETS
    from .data.files import LOCAL_SUFFIXES, check_prompts, load_local_dataset

    name = script_args.dataset_name
    default_rewards: list[str] = []
    if name in BUILTIN_DATASETS:
        builder, default_rewards = BUILTIN_DATASETS[name]
        dataset = builder(seed=training_args.seed)
    elif Path(name).suffix in LOCAL_SUFFIXES:
        dataset = load_local_dataset(name)
    else:
        dataset, default_rewards = _benchmark_or_hub(name, script_args)
    column = script_args.dataset_prompt_column
    if column not in dataset.column_names:
        raise CLIError(
            f"dataset '{name}' has no column '{column}' (columns: "
            f"{', '.join(dataset.column_names)}); set dataset_prompt_column to the prompt column"
        )
    if column != "prompt":
        dataset = dataset.rename_column(column, "prompt")
    if script_args.max_train_samples is not None:
        dataset = dataset.select(range(min(script_args.max_train_samples, len(dataset))))
    check_prompts(dataset, column, name)
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

    if script_args.reward_funcs is not None and not script_args.reward_funcs:
        raise CLIError("reward_funcs is empty ([]); list at least one reward (e.g. [math_accuracy, format]) or remove "
                       "the key to use the dataset's default" + (f" ({', '.join(default_rewards)})" if default_rewards
                                                                 else ""))
    names = script_args.reward_funcs or default_rewards
    if not names:
        raise CLIError("reward_funcs is empty; list reward names (e.g. [math_accuracy, format]) or dotted paths")
    try:
        kwargs = json.loads(script_args.reward_kwargs) if isinstance(script_args.reward_kwargs, str) else script_args.reward_kwargs
    except json.JSONDecodeError as e:
        raise CLIError(f"reward_kwargs is not valid JSON: {e.msg}") from None
    # `my_rewards.score` in a YAML finds ./my_rewards.py without `PYTHONPATH=.`, as under `python -m`.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return resolve_rewards(names, kwargs)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _reward_name(func) -> str:
    return getattr(func, "__name__", type(func).__name__)


def check_rewards(reward_funcs, dataset, training_args, dataset_name) -> None:
    """Before training: every reward finds the dataset columns it reads, and some completion can be correct."""
    from .rewards import missing_columns, reward_range

    columns = dataset.column_names
    for func in reward_funcs:
        missing = missing_columns(func, columns)
        if missing:
            raise CLIError(
                f"reward '{_reward_name(func)}' reads the column{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(c) for c in missing)}, which dataset '{dataset_name}' lacks (columns: "
                f"{', '.join(c for c in columns)}); add or rename the column, or choose another reward"
            )
    ranges = [reward_range(f) for f in reward_funcs]
    weights = training_args.reward_weights or [1.0] * len(reward_funcs)
    if None in ranges or len(weights) != len(reward_funcs):
        return
    best = sum(w * (hi if w >= 0 else lo) for w, (lo, hi) in zip(weights, ranges))
    threshold = training_args.correct_reward_threshold
    if threshold >= best:
        raise CLIError(
            f"correct_reward_threshold is {threshold:g}, but the highest total reward these rewards can give is "
            f"{best:g} ({', '.join(_reward_name(f) for f in reward_funcs)} with reward_weights "
            f"{', '.join(f'{w:g}' for w in weights)}), so every completion would count as wrong (correct means total "
            f"reward > correct_reward_threshold); set it below {best:g}, e.g. {best / 2:g}"
        )


def _context_length(config) -> int | None:
    config = getattr(config, "text_config", None) or config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _prompt_length(tokenizer, prompt) -> int:
    if isinstance(prompt, list):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    else:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return len(ids)


def check_prompt_lengths(model: str, dataset, training_args, dataset_name, max_checked: int = 256) -> None:
    """Before the model loads: no prompt longer than the model's context; a warning when prompt plus
    `max_completion_length` does not fit. Reads only the tokenizer and `config.json`; checks the `max_checked`
    longest prompts (by characters)."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        context = _context_length(AutoConfig.from_pretrained(model))
        tokenizer = AutoTokenizer.from_pretrained(model)
    except Exception:  # noqa: BLE001 - no config or tokenizer here: the trainer reports it when it loads the model
        return
    if context is None:
        return
    prompts = dataset["prompt"]
    chars = [len(json.dumps(p)) if isinstance(p, list) else len(str(p)) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -chars[i])[:max_checked]
    lengths = {i: _prompt_length(tokenizer, prompts[i]) for i in order}
    i, longest = max(lengths.items(), key=lambda kv: kv[1])
    if longest >= context:
        raise CLIError(
            f"dataset '{dataset_name}' row {i} has a {longest}-token prompt, as long as the model's whole context "
            f"({context} tokens) with no room for a completion; shorten or drop long prompts (filter the dataset)"
        )
    too_long = sorted(j for j, n in lengths.items() if n + training_args.max_completion_length > context)
    if too_long and _is_main_process():
        print(f"warning: {len(too_long)} prompts (e.g. row {too_long[0]}, {lengths[too_long[0]]} tokens) plus "
              f"max_completion_length ({training_args.max_completion_length}) exceed the model's context ({context} "
              "tokens): their completions get cut short; lower max_completion_length or shorten those prompts",
              file=sys.stderr)


def check_model_and_engine(model: str, training_args) -> None:
    """Before the model loads: a model that exists, vLLM when asked for, and a push that can work at the end."""
    from trl.import_utils import is_vllm_available

    from .hub.model_source import check_model_source

    check_model_source(model)
    if training_args.use_vllm and not is_vllm_available():
        raise CLIError("use_vllm is true but vLLM is not installed; pip install 'exploration-trl[vllm]' (on a CUDA "
                       "machine), or set use_vllm: false to generate with transformers")
    if training_args.push_to_hub:
        from .hub.push import check_push_ready

        check_push_ready(training_args.hub_model_id)


def _toy_model(training_args, script_args):
    """`model_name_or_path: toy` builds the offline toy backbone into `<output_dir>/toy_base`."""
    from .toy import make_toy_checkpoint

    path = Path(training_args.output_dir) / "toy_base"
    # The args' own process state (created with `cpu=use_cpu`) sees a CPU launch as distributed; one process writes.
    with training_args.main_process_first(desc="toy model"):
        if not (path / "model.safetensors").exists():
            make_toy_checkpoint(path, alphabet=script_args.toy_alphabet, seed=training_args.seed)
    return str(path)


class _Stage:
    """Where `train` is, so that an error raised while progress bars run starts on a fresh line."""

    training = False


def train_main(argv: list[str]) -> int:
    script_args, training_args, model_args = parse_train_args(argv)
    import torch
    from trl import get_peft_config

    from .hub.outcome import outcome_notes
    from .hub.trainer_card import trainer_outcome
    from .trainers.weights import weights_changed, weights_fingerprint
    from .rewards import naming_errors
    from .trainers import get_trainer_class

    if script_args.max_train_samples is not None and script_args.max_train_samples <= 0:
        raise CLIError(f"max_train_samples is {script_args.max_train_samples}, which leaves no training rows; set a "
                       "positive number or remove the key to use every row")
    trainer_cls = get_trainer_class(script_args.method)
    model = model_args.model_name_or_path or TOY_MODEL
    if model == TOY_MODEL:
        model = _toy_model(training_args, script_args)
    else:
        if model_args.dtype not in (None, "auto"):
            training_args.model_init_kwargs = {**(training_args.model_init_kwargs or {}), "dtype": model_args.dtype}
    check_model_and_engine(model, training_args)
    dataset, default_rewards = load_train_dataset(script_args, training_args)
    reward_funcs = resolve_reward_funcs(script_args, default_rewards)
    check_rewards(reward_funcs, dataset, training_args, script_args.dataset_name)
    check_prompt_lengths(model, dataset, training_args, script_args.dataset_name)
    # An exception in a reward (the user's code) keeps its traceback and names the reward.
    reward_funcs = [f if isinstance(f, torch.nn.Module) else naming_errors(f) for f in reward_funcs]
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
    trainer.model_card_info = {"dataset": script_args.dataset_name, "base_model": model}  # for every card it writes
    before = weights_fingerprint(trainer.model)
    _Stage.training = True
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    _Stage.training = False
    changed = trainer.model_card_info["weights_changed"] = weights_changed(trainer, before)
    trainer.save_model(training_args.output_dir)  # writes the card too (`ExplorationGRPOTrainer.create_model_card`)
    if trainer.accelerator.is_main_process:
        for note in outcome_notes(trainer_outcome(trainer, changed)):
            print(f"warning: {note}", file=sys.stderr)
    if push_to_hub and trainer.accelerator.is_main_process:
        from .hub import push_output_dir

        push_output_dir(training_args.output_dir, training_args.hub_model_id)
    # Leave the process group cleanly: exiting with it alive lets gloo's threads be torn down at interpreter exit,
    # which aborts the process ("terminate called without an active exception") after a successful run.
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return 0


# ---------------------------------------------------------------------------------------------- main
SUBCOMMAND_MODULES = (
    "exploration_trl.eval.command",
    "exploration_trl.experiments.tree",
    "exploration_trl.experiments.countdown_tiny",
    "exploration_trl.experiments.demo",
    "exploration_trl.hub.command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exploration-trl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="Train with a TRL-style YAML (--config) and --key value overrides "
                           "(`exploration-trl train --help`).", add_help=False)
    train.set_defaults(func=None)
    for module in SUBCOMMAND_MODULES:
        try:
            importlib.import_module(module).register(sub)
        except ImportError:
            continue
    return parser


def _train(argv: list[str]) -> int:
    if "--help-all" in argv:
        _print_help_all(argv)
        return 0
    if "--help" in argv or "-h" in argv:
        print(train_help())
        return 0
    return train_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "train":
            return _train(argv[1:])
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except (CLIError, ValueError, FileNotFoundError) as e:
        # Raised mid-training, start a fresh line: a progress bar may hold the current one.
        lead = "\n" if _Stage.training else ""
        print(f"{lead}error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    except HookDidNotRunError as e:  # not a user mistake: one line naming the method, and a non-zero exit
        print(f"\nerror: {e}", file=sys.stderr)
        return 1
    finally:
        _Stage.training = False


if __name__ == "__main__":
    sys.exit(main())

"""The training YAML before TRL sees it: where `--config` points, reading the file, the method it names, and each
value checked against the type its key takes on the command line."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path

from .common import CLIError


def example_value(kind: str) -> str:
    return {"float": "1e-6", "int": "10", "string_to_bool": "true"}.get(kind, "VALUE")


def config_path(argv: list[str]) -> str | None:
    if "--config" not in argv:
        return None
    i = argv.index("--config")
    if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
        raise CLIError("--config needs a YAML file, e.g. exploration-trl train --config configs/smoke_toy_countdown.yaml")
    return argv[i + 1]


def read_yaml(path: str) -> dict:
    import yaml

    if not Path(path).is_file():
        raise CLIError(f"config file '{path}' not found")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise CLIError(f"config file '{path}' is not valid YAML{where} ({problem}); fix the syntax there") from None
    if data is None or data == {}:
        # Without this an empty file (or one of comments only) would start a run of every default, on no model.
        raise CLIError(f"config file '{path}' is empty; give at least model_name_or_path, dataset_name and "
                       "reward_funcs (see configs/smoke_toy_countdown.yaml)")
    if not isinstance(data, dict):
        raise CLIError(f"config file '{path}' must hold a YAML mapping of key: value")
    return data


def method_from(argv: list[str]) -> str:
    """The method decides the config class, so read it before building the parser (CLI beats YAML)."""
    for i, a in enumerate(argv):
        if a == "--method" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--method="):
            return a.split("=", 1)[1]
    path = config_path(argv)
    if path is not None:
        return str(read_yaml(path).get("method", "grpo"))
    return "grpo"


def normalise_argv(argv: list[str]) -> list[str]:
    """`--config=FILE` -> `--config FILE` (TRL's parser reads only the second form)."""
    out = []
    for a in argv:
        out += a.split("=", 1) if a.startswith("--config=") else [a]
    return out


def allows_none(classes, key: str) -> bool:
    for cls in classes:
        if key in cls.__dataclass_fields__:
            try:
                hint = typing.get_type_hints(cls)[key]
            except Exception:  # noqa: BLE001 - unresolvable annotations: do not second-guess them
                return True
            return type(None) in typing.get_args(hint) or hint is typing.Any
    return True


def coerce_value(key: str, value, action, where: str):
    """`value` of YAML key `key` as its field's type, or a `CLIError` naming key, value and a valid example.

    TRL hands YAML values to the dataclasses untyped (`max_steps: 2.5` then fails deep inside training), so they are
    checked here against the type argparse would apply on the command line. YAML reads `1e-6` as a string; a string
    that is a number is accepted for a number."""
    kind = getattr(action.type, "__name__", None)
    if kind not in ("int", "float", "string_to_bool") and not action.choices:
        return value
    if isinstance(value, (list, tuple)) and action.nargs in ("+", "*"):
        return [coerce_value(key, v, argparse.Namespace(type=action.type, choices=action.choices, nargs=None), where)
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
        raise CLIError(f"{key} in {where} must be {what}, got {value!r}; write e.g. {key}: {example_value(kind)}")
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
